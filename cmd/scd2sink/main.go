// Command scd2sink keeps SCD Type 2 history tables in PostgreSQL from
// Debezium change events in Kafka. See README.md and DESIGN.md.
package main

import (
	"fmt"
	"os"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	if len(os.Args) > 1 && os.Args[1] == "version" {
		fmt.Println("scd2sink", version)
		return
	}
	fmt.Fprintln(os.Stderr, "usage: scd2sink version   (run, rebuild, verify and demo are not built yet)")
	os.Exit(2)
}
