package debezium

import (
	"strconv"
	"strings"
	"sync"

	"github.com/scd2sink/scd2sink/internal/change"
)

// A sequence path ending in "gtid" (source.gtid of the MySQL and MariaDB
// connectors) is read as a GTID, not as text, so that it orders across a
// failover (docs/sources.md):
//
//   - MariaDB's "domain-server-seq" compares as [domain, seq]. The server
//     id is left out: with gtid_strict_mode a promoted replica goes on
//     numbering the domain where the old primary stopped ("0-1-32", then
//     "0-2-33"), while its binlog file names and positions start again.
//     Numbers compare numerically ("0-1-9" before "0-1-10").
//   - MySQL's "uuid:N" (or "uuid:tag:N") compares as ["uuid", N]: N
//     orders the transactions of one source server only, and a failover
//     starts another uuid. Such a sequence is right until the first
//     failover; docs/sources.md says what to use instead.
//
// Each GTID names its stream (the MariaDB domain, the MySQL source uuid).
// Streams do not order each other: events of one key in two streams are
// ordered by stream, which is an arbitrary rule, so the first event of a
// topic in a stream other than the topic's first is reported (see
// Decoder.SetStreamHook).

// isGTIDPath says whether a sequence path is read as a GTID.
func isGTIDPath(p []string) bool { return len(p) > 0 && p[len(p)-1] == "gtid" }

// appendGTID appends the comparable form of a GTID and returns its stream;
// ok is false for a value of neither form (seq then unchanged).
func appendGTID(seq []byte, s string) (out []byte, stream string, ok bool) {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, ':'); i > 0 { // MySQL: uuid[:tag]:N
		if n, err := strconv.ParseInt(s[i+1:], 10, 64); err == nil && n >= 0 && !strings.ContainsAny(s[:i], ", \n") { // not a GTID set
			src := s[:i]
			seq = change.AppendSeqText(seq, src)
			return change.AppendSeqInt(seq, n), src, true
		}
	}
	if d, rest, found := strings.Cut(s, "-"); found { // MariaDB: domain-server-seq
		if _, n, found := strings.Cut(rest, "-"); found {
			dom, err1 := strconv.ParseUint(d, 10, 32)
			num, err2 := strconv.ParseUint(n, 10, 64)
			if err1 == nil && err2 == nil && num <= 1<<63-1 {
				seq = change.AppendSeqInt(seq, int64(dom))
				return change.AppendSeqInt(seq, int64(num)), d, true
			}
		}
	}
	return seq, "", false
}

// maxStreams bounds the streams remembered per topic; a topic seeing more
// than that is reported once more and then no longer watched.
const maxStreams = 64

// streams remembers the GTID streams a topic's events came from.
type streams struct {
	mu   sync.Mutex
	seen map[string]bool
	full bool
}

// note records stream; isNew is true when the topic had seen another
// stream before (other is one of them, for the report).
func (s *streams) note(stream string) (other string, isNew bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.full || s.seen[stream] {
		return "", false
	}
	// stream is cut from the record's bytes, which the consumer reuses:
	// the map keeps its own copy.
	stream = strings.Clone(stream)
	if s.seen == nil {
		s.seen = map[string]bool{stream: true}
		return "", false
	}
	for k := range s.seen {
		if other == "" || k < other {
			other = k
		}
	}
	s.seen[stream] = true
	if len(s.seen) >= maxStreams {
		s.full = true
	}
	return other, true
}
