package main

import (
	"runtime"
	"runtime/debug"
)

// versionLine is what `scd2sink version` prints: the version set at build
// time (-ldflags "-X main.version=…", as the image is built), else the
// module version Go recorded (a `go install …@v1.2.3`), then the VCS
// revision and commit time Go stamps into a binary built from a checkout
// (marked modified when the tree had changes), and the Go version.
func versionLine() string {
	v, rev, at, modified, gov := moduleVersion(), "", "", "", runtime.Version()
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.time":
				at = s.Value
			case "vcs.modified":
				if s.Value == "true" {
					modified = " (modified)"
				}
			}
		}
		if bi.GoVersion != "" {
			gov = bi.GoVersion
		}
	}
	out := "scd2sink " + v
	if rev != "" {
		out += ", revision " + rev + modified
	}
	if at != "" {
		out += ", committed " + at
	}
	return out + ", " + gov
}

// moduleVersion is the version set at build time, else the module
// version Go recorded, else "dev".
func moduleVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok && version == "dev" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return version
}
