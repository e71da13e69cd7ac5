package app

import (
	"errors"
	"net/url"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/scd2sink/scd2sink/config"
)

// initSecrets takes the secrets out of what init was given, before
// anything is printed (DESIGN.md section 9: a command that prints a
// configuration never prints a secret it was given). It returns the DSN
// without its password and whether it had one. Neither the DSN nor a
// parser's error about it is ever quoted: both may hold the password.
func initSecrets(o *InitOptions) (hadPassword bool, err error) {
	if o.Registry != "" {
		// url.Parse's errors quote the URL.
		if u, err := url.Parse(o.Registry); err != nil || u.User != nil || u.Host == "" {
			return false, &config.Error{Key: "--registry", Msg: "is not a URL without credentials: give the URL alone, then set " +
				"schema_registry.username and password_file (or SCD2SINK_SCHEMA_REGISTRY_PASSWORD) in the file"}
		}
	}
	if o.DSN == "" {
		return false, nil
	}
	if _, err := pgconn.ParseConfig(o.DSN); err != nil {
		return false, &config.Error{Key: "--dsn", Msg: "is not a valid PostgreSQL connection string (not shown: it may hold a password)"}
	}
	bare, had, err := dsnWithoutPassword(o.DSN)
	if err != nil {
		return false, &config.Error{Key: "--dsn", Msg: "cannot be read to leave its password out (" + err.Error() + ")"}
	}
	o.DSN = bare
	return had, nil
}

// dsnWithoutPassword removes password and sslpassword from a URL or a
// key=value DSN (keys and values as libpq and pgconn read them: a value
// single-quoted or up to whitespace, with backslash escapes).
func dsnWithoutPassword(dsn string) (string, bool, error) {
	secret := func(k string) bool { return k == "password" || k == "sslpassword" }
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", false, errors.New("not a URL")
		}
		had := false
		if u.User != nil {
			if _, ok := u.User.Password(); ok {
				u.User, had = url.User(u.User.Username()), true
			}
		}
		q := u.Query()
		for k := range q {
			if secret(k) {
				q.Del(k)
				had = true
			}
		}
		if had {
			u.RawQuery = q.Encode()
		}
		return u.String(), had, nil
	}
	const ws = " \t\n\r\v\f"
	var kept []string
	had, s := false, strings.TrimLeft(dsn, ws)
	for s != "" {
		eq := strings.IndexByte(s, '=')
		if eq < 0 {
			return "", false, errors.New("a word without =")
		}
		key := strings.Trim(s[:eq], ws)
		s = strings.TrimLeft(s[eq+1:], ws)
		i := 0
		if strings.HasPrefix(s, "'") {
			for i = 1; i < len(s) && s[i] != '\''; i++ {
				if s[i] == '\\' {
					i++
				}
			}
			if i >= len(s) {
				return "", false, errors.New("an unterminated quote")
			}
			i++
		} else {
			for i < len(s) && !strings.ContainsRune(ws, rune(s[i])) {
				if s[i] == '\\' {
					i++
				}
				i++
			}
			i = min(i, len(s))
		}
		raw := s[:i]
		s = strings.TrimLeft(s[i:], ws)
		if secret(key) {
			had = true
			continue
		}
		kept = append(kept, key+"="+raw)
	}
	return strings.Join(kept, " "), had, nil
}
