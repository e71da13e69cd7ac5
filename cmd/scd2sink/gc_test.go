package main

import "testing"

// The collector runs only at the limit scd2sink sets itself; a limit from
// the environment keeps collection by growth (GOGC=200), and GOGC from the
// environment is never overridden.
func TestGCDefaults(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		env  map[string]string
		want gcSettings
	}{
		{"nothing set: 200 MiB, off", nil, gcSettings{limit: 200 << 20, percent: -1, setPercent: true}},
		{"GOGC set: 200 MiB, GOGC kept", map[string]string{"GOGC": "100"}, gcSettings{limit: 200 << 20, percent: -1}},
		{"GOMEMLIMIT set: GOGC 200", map[string]string{"GOMEMLIMIT": "off"}, gcSettings{percent: 200, setPercent: true}},
		{"both set: nothing", map[string]string{"GOMEMLIMIT": "1GiB", "GOGC": "50"}, gcSettings{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := gcDefaults(func(k string) string { return tc.env[k] }); got != tc.want {
				t.Errorf("gcDefaults = %+v, want %+v", got, tc.want)
			}
		})
	}
}
