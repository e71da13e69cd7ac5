package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestInitKeepsSecretsOut: `scd2sink init` given a DSN with a password
// (URL, URL parameter, key=value, quoted key=value) writes the DSN without
// it and a reference to where it goes instead, and what it writes passes
// run's validation as is; a DSN init cannot read, and a registry URL with
// credentials, exit 2 naming the flag. The password appears nowhere in
// what it prints, on stdout or stderr (DESIGN.md section 9).
func TestInitKeepsSecretsOut(t *testing.T) {
	t.Parallel()
	src := &scdtest.Source{Server: "shop", DB: "shop", Schema: "public", Table: "customers", Keys: []string{"id"},
		Cols: []scdtest.Col{{Name: "id", Schema: `{"type":"int32","optional":false}`}, {Name: "plan", Schema: `{"type":"string","optional":true}`}}}
	kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, src.Topic()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kafka.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	k, v := src.Envelope(scdtest.Change{Op: "c", After: scdtest.Row{"id": 1, "plan": "a"}, LSN: 100, Commit: time.Now()})
	if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: src.Topic(), Key: k, Value: v}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	brokers := strings.Join(kafka.ListenAddrs(), ",")
	for _, tc := range []struct {
		name string
		args []string
		flag string // "" if init succeeds, else the flag its exit 2 names
	}{
		{"url", []string{"--dsn", "postgres://u:s3cret@h:5432/db?sslmode=disable"}, ""},
		{"url parameter", []string{"--dsn", "postgres://u@h/db?password=s3cret&sslmode=disable"}, ""},
		{"key=value", []string{"--dsn", "host=h user=u password=s3cret dbname=db"}, ""},
		{"quoted key=value", []string{"--dsn", "host=h user=u password='s3cret x' dbname=db sslpassword=s3cret"}, ""},
		{"invalid url", []string{"--dsn", "postgres://u:s3cret@h:notaport/db"}, "--dsn"},
		{"invalid key=value", []string{"--dsn", "host=h password=s3cret port=notaport"}, "--dsn"},
		{"registry credentials", []string{"--registry", "https://u:s3cret@reg.example"}, "--registry"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := run(t, append([]string{"init", "--brokers", brokers, "--wait", "5s"}, tc.args...)...)
			if strings.Contains(out+errOut, "s3cret") {
				t.Fatalf("the password is printed:\nstdout:\n%s\nstderr:\n%s", out, errOut)
			}
			if tc.flag != "" {
				if code != 2 || !strings.Contains(errOut, tc.flag) {
					t.Fatalf("exit %d, stderr %q; want 2 naming %s", code, errOut, tc.flag)
				}
				return
			}
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			if _, err := config.Parse([]byte(out), func(string) (string, bool) { return "", false }); err != nil {
				t.Fatalf("what init wrote does not pass validation: %v\n%s", err, out)
			}
			if !strings.Contains(out, "SCD2SINK_POSTGRES_DSN") || !strings.Contains(out, "dsn_file") {
				t.Fatalf("no reference to where the password goes:\n%s", out)
			}
		})
	}
}
