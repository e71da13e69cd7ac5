// Package deploy holds the deployment: docker-compose.yml at the top level,
// scd2sink's configuration for it, the connector registration, the sample
// source schema and workload, and a Grafana dashboard. CI has no Docker;
// this test checks that the pieces agree with each other.
package deploy

import (
	"context"
	"encoding/json"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/scd2sink/scd2sink/config"
)

func load(t *testing.T) *types.Project {
	t.Helper()
	abs, err := filepath.Abs("../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	p, err := loader.LoadWithContext(context.Background(), types.ConfigDetails{
		WorkingDir:  filepath.Dir(abs),
		ConfigFiles: []types.ConfigFile{{Filename: abs}},
		Environment: map[string]string{},
	}, func(o *loader.Options) { o.SetProjectName("scd2sink", true) })
	if err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	return p
}

func service(t *testing.T, p *types.Project, name string) types.ServiceConfig {
	t.Helper()
	s, ok := p.Services[name]
	if !ok {
		t.Fatalf("docker-compose.yml has no service %q", name)
	}
	return s
}

func env(s types.ServiceConfig, key string) string {
	if v, ok := s.Environment[key]; ok && v != nil {
		return *v
	}
	return ""
}

// mount returns the host file mounted at target in s.
func mount(t *testing.T, s types.ServiceConfig, target string) string {
	t.Helper()
	for _, v := range s.Volumes {
		if v.Target == target {
			return v.Source
		}
	}
	t.Fatalf("service %s mounts nothing at %s", s.Name, target)
	return ""
}

func TestComposeAgrees(t *testing.T) {
	p := load(t)
	for _, name := range []string{"kafka", "source", "connect", "target", "scd2sink"} {
		if service(t, p, name).HealthCheck == nil {
			t.Errorf("service %s has no health check", name)
		}
	}
	kafka, source, connect, target, sink := service(t, p, "kafka"), service(t, p, "source"), service(t, p, "connect"),
		service(t, p, "target"), service(t, p, "scd2sink")
	if !strings.HasPrefix(kafka.Image, "apache/kafka:") || !strings.Contains(env(kafka, "KAFKA_PROCESS_ROLES"), "controller") {
		t.Errorf("kafka is not Apache Kafka in KRaft mode: %s %v", kafka.Image, kafka.Environment)
	}
	// The images are the versions the end-to-end suite checks.
	for _, v := range []struct{ image, pom, prop string }{
		{kafka.Image, "../e2e/maven/kafka/pom.xml", `<kafka.version>([^<]+)</kafka.version>`},
		{connect.Image, "../e2e/maven/debezium/pom.xml", `<artifactId>debezium-connector-postgres</artifactId>\s*<version>([^<]+)</version>`},
	} {
		pom, err := os.ReadFile(v.pom)
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(v.prop).FindSubmatch(pom)
		if m == nil {
			t.Fatalf("%s: no version matching %s", v.pom, v.prop)
		}
		if _, tag, _ := strings.Cut(v.image, ":"); tag != string(m[1]) {
			t.Errorf("image %s: the e2e suite checks %s (%s)", v.image, m[1], v.pom)
		}
	}
	// Host ports clear of a local PostgreSQL or Kafka, on loopback only.
	for _, s := range p.Services {
		for _, port := range s.Ports {
			if port.Published == "5432" || port.Published == "9092" || port.HostIP != "127.0.0.1" {
				t.Errorf("service %s publishes %s:%s: it collides with a local server or is open beyond loopback", s.Name, port.HostIP, port.Published)
			}
		}
	}
	if !slices.Contains(source.Command, "wal_level=logical") {
		t.Errorf("the source has no logical decoding: %v", source.Command)
	}
	if env(connect, "BOOTSTRAP_SERVERS") != strings.TrimPrefix(env(kafka, "KAFKA_ADVERTISED_LISTENERS"), "PLAINTEXT://") {
		t.Errorf("connect's bootstrap %q is not kafka's advertised listener %q", env(connect, "BOOTSTRAP_SERVERS"), env(kafka, "KAFKA_ADVERTISED_LISTENERS"))
	}

	// scd2sink's configuration, as the container sees it.
	cfgFile := mount(t, sink, "/etc/scd2sink/scd2sink.yaml")
	dockerfile, err := os.ReadFile("../Dockerfile")
	if err != nil || !strings.Contains(string(dockerfile), `"--config", "/etc/scd2sink/scd2sink.yaml"`) {
		t.Errorf("the Dockerfile does not run with the mounted config: %v", err)
	}
	raw, err := os.ReadFile(cfgFile)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse(raw, func(k string) (string, bool) {
		v, ok := sink.Environment[k]
		if !ok || v == nil {
			return "", false
		}
		return *v, true
	})
	if err != nil {
		t.Fatalf("%s: %v", cfgFile, err)
	}
	if want := strings.TrimPrefix(env(kafka, "KAFKA_ADVERTISED_LISTENERS"), "PLAINTEXT://"); !slices.Equal(cfg.Kafka.Brokers, []string{want}) {
		t.Errorf("scd2sink's brokers %v, kafka advertises %s", cfg.Kafka.Brokers, want)
	}
	dsn, err := url.Parse(cfg.Postgres.DSN)
	if err != nil || dsn.Hostname() != "target" || dsn.Port() != "5432" || strings.TrimPrefix(dsn.Path, "/") != env(target, "POSTGRES_DB") {
		t.Errorf("scd2sink's DSN %s does not name the target service's database %s", cfg.Postgres.DSN, env(target, "POSTGRES_DB"))
	}
	_, port, _ := net.SplitHostPort(cfg.HTTPAddr())
	published := false
	for _, p := range sink.Ports {
		published = published || strconv.Itoa(int(p.Target)) == port
	}
	if !published || !strings.HasPrefix(cfg.HTTPAddr(), "0.0.0.0:") {
		t.Errorf("metrics on %s are not reachable through the published ports %v", cfg.HTTPAddr(), sink.Ports)
	}
	if _, ok := sink.DependsOn["kafka"]; !ok {
		t.Error("scd2sink does not wait for kafka")
	}

	// The connector writes the topics scd2sink reads, from the source service.
	var conn map[string]string
	rawConn, err := os.ReadFile(mount(t, service(t, p, "register"), "/connector.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(rawConn, &conn); err != nil {
		t.Fatalf("connector.json: %v", err)
	}
	if conn["database.hostname"] != "source" || conn["database.dbname"] != env(source, "POSTGRES_DB") || conn["value.converter.schemas.enable"] != "true" {
		t.Errorf("connector.json does not read the source service with schemas on: %v", conn)
	}
	var topics, configured []string
	for _, tbl := range strings.Split(conn["table.include.list"], ",") {
		topics = append(topics, conn["topic.prefix"]+"."+tbl)
	}
	for _, tb := range cfg.Tables {
		configured = append(configured, tb.Topic)
	}
	slices.Sort(topics)
	slices.Sort(configured)
	if !slices.Equal(topics, configured) {
		t.Errorf("Debezium writes %v, scd2sink reads %v", topics, configured)
	}

	// The source schema has every captured table; the end-to-end suite
	// uses the same schema and the same tables section.
	initSQL, err := os.ReadFile(mount(t, source, "/docker-entrypoint-initdb.d/init.sql"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tbl := range strings.Split(conn["table.include.list"], ",") {
		name := strings.TrimPrefix(tbl, "public.")
		if !regexp.MustCompile(`(?i)CREATE TABLE ` + name + ` \(`).Match(initSQL) {
			t.Errorf("deploy/source-init.sql does not create %s", name)
		}
	}
	e2e, err := os.ReadFile("../e2e/e2e_test.go")
	if err != nil || !strings.Contains(string(e2e), `"../deploy/scd2sink.yaml"`) {
		t.Errorf("the end-to-end suite does not take its tables from deploy/scd2sink.yaml: %v", err)
	}
}

// The dashboard is valid JSON and every metric it queries is one scd2sink
// serves (docs/operations.md's list).
func TestDashboard(t *testing.T) {
	raw, err := os.ReadFile("grafana/scd2sink.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash map[string]any
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	readme, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	metrics := regexp.MustCompile(`scd2sink_[a-z_]+`).FindAllString(string(raw), -1)
	if len(metrics) < 8 {
		t.Fatalf("the dashboard queries %d metrics", len(metrics))
	}
	for _, m := range metrics {
		base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(m, "_bucket"), "_sum"), "_count")
		if !strings.Contains(string(readme), "`"+base) {
			t.Errorf("the dashboard queries %s, which docs/operations.md does not list", m)
		}
	}
}
