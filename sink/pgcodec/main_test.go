package pgcodec_test

import (
	"os"
	"testing"

	"github.com/scd2sink/scd2sink/internal/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }
