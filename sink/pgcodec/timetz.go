package pgcodec

import (
	"database/sql/driver"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgtype"
)

// Timetz is a time with time zone, which pgx has no type for: COPY needs
// its binary form (microseconds since midnight, then the zone as seconds
// west of UTC, as PostgreSQL stores it).
type Timetz struct {
	us   int64
	west int32
}

func (t Timetz) String() string {
	east := -int(t.west)
	sign := "+"
	if east < 0 {
		sign, east = "-", -east
	}
	s := fmt.Sprintf("%02d:%02d:%02d", t.us/3600e6, t.us/60e6%60, t.us/1e6%60)
	if f := t.us % 1e6; f != 0 {
		s += strings.TrimRight(fmt.Sprintf(".%06d", f), "0")
	}
	s += fmt.Sprintf("%s%02d", sign, east/3600)
	if m := east / 60 % 60; m != 0 {
		s += fmt.Sprintf(":%02d", m)
	}
	return s
}

// ParseTimetz reads "HH:MM:SS[.ffffff](Z|±HH[:MM[:SS]])", as Debezium's
// ZonedTime and PostgreSQL's output write it.
func ParseTimetz(s string) (Timetz, error) {
	bad := fmt.Errorf("%q is not a time with time zone", ClipText(s))
	i := strings.IndexAny(s, "Z+-")
	if i < 8 {
		return Timetz{}, bad
	}
	clock, zone := s[:i], s[i:]
	parts := strings.Split(clock, ":")
	if len(parts) != 3 {
		return Timetz{}, bad
	}
	h, err1 := strconv.Atoi(parts[0])
	m, err2 := strconv.Atoi(parts[1])
	sec, err3 := strconv.ParseFloat(parts[2], 64)
	if err1 != nil || err2 != nil || err3 != nil || h < 0 || h > 24 || m < 0 || m > 59 || sec < 0 || sec >= 61 {
		return Timetz{}, bad
	}
	t := Timetz{us: int64(h)*3600e6 + int64(m)*60e6 + int64(sec*1e6+0.5)}
	if zone == "Z" {
		return t, nil
	}
	sign := 1
	if zone[0] == '-' {
		sign = -1
	}
	zp := strings.Split(zone[1:], ":")
	east := 0
	for k, unit := range []int{3600, 60, 1} {
		if k >= len(zp) {
			break
		}
		n, err := strconv.Atoi(zp[k])
		if err != nil {
			return Timetz{}, bad
		}
		east += n * unit
	}
	t.west = int32(-sign * east)
	return t, nil
}

// timetzCodec is the pgx codec of Timetz, binary only.
type timetzCodec struct{}

func (timetzCodec) FormatSupported(f int16) bool { return f == pgtype.BinaryFormatCode }
func (timetzCodec) PreferredFormat() int16       { return pgtype.BinaryFormatCode }

func (timetzCodec) PlanEncode(_ *pgtype.Map, _ uint32, format int16, value any) pgtype.EncodePlan {
	if _, ok := value.(Timetz); ok && format == pgtype.BinaryFormatCode {
		return timetzEncoder{}
	}
	return nil
}

func (timetzCodec) PlanScan(*pgtype.Map, uint32, int16, any) pgtype.ScanPlan { return nil }

func (c timetzCodec) DecodeDatabaseSQLValue(m *pgtype.Map, oid uint32, format int16, src []byte) (driver.Value, error) {
	v, err := c.DecodeValue(m, oid, format, src)
	if v == nil || err != nil {
		return nil, err
	}
	return v.(Timetz).String(), nil
}

func (timetzCodec) DecodeValue(_ *pgtype.Map, _ uint32, format int16, src []byte) (any, error) {
	if src == nil {
		return nil, nil
	}
	if format != pgtype.BinaryFormatCode {
		return ParseTimetz(string(src))
	}
	if len(src) != 12 {
		return nil, fmt.Errorf("timetz: %d bytes, want 12", len(src))
	}
	return Timetz{us: int64(binary.BigEndian.Uint64(src)), west: int32(binary.BigEndian.Uint32(src[8:]))}, nil
}

type timetzEncoder struct{}

func (timetzEncoder) Encode(value any, buf []byte) ([]byte, error) {
	t := value.(Timetz)
	buf = binary.BigEndian.AppendUint64(buf, uint64(t.us))
	return binary.BigEndian.AppendUint32(buf, uint32(t.west)), nil
}
