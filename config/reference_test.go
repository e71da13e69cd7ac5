package config

import (
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
)

// yamlKeys lists the configuration's keys as dotted paths (tables[].keys),
// from the structs' yaml tags.
func yamlKeys(prefix string, t reflect.Type) []string {
	var out []string
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "" || name == "-" {
			continue
		}
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		switch {
		case ft.Kind() == reflect.Struct && ft != reflect.TypeOf(time.Time{}):
			out = append(out, yamlKeys(prefix+name+".", ft)...)
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
			out = append(out, yamlKeys(prefix+name+"[].", ft.Elem())...)
		default:
			out = append(out, prefix+name)
		}
	}
	return out
}

// docs/configuration.md documents every key the configuration reads (a
// key added without a line there fails this test), and its whole example
// passes validation.
func TestConfigurationReference(t *testing.T) {
	doc, err := os.ReadFile("../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	keys := yamlKeys("", reflect.TypeOf(Config{}))
	if len(keys) < 70 {
		t.Fatalf("only %d keys found: the walk is broken", len(keys))
	}
	for _, k := range keys {
		if !strings.Contains(string(doc), "| `"+k+"` |") {
			t.Errorf("docs/configuration.md has no row for %s", k)
		}
	}
	_, example, ok := strings.Cut(string(doc), "## A whole example\n\n```yaml\n")
	if !ok {
		t.Fatal("docs/configuration.md has no whole example")
	}
	example, _, _ = strings.Cut(example, "```")
	if _, err := Parse([]byte(example), noEnv); err != nil {
		t.Errorf("the whole example does not pass validation: %v", err)
	}
}
