package sink

import (
	"fmt"
	"os"
	"time"
)

var traceOn = os.Getenv("SCD2SINK_TRACE") != ""
var traceAcc = map[string]time.Duration{}

func trace(name string, start time.Time) {
	if traceOn {
		traceAcc[name] += time.Since(start)
	}
}

// TraceDump prints accumulated phase times (debug only).
func TraceDump() {
	for k, v := range traceAcc {
		fmt.Fprintf(os.Stderr, "%-20s %v\n", k, v)
	}
}
