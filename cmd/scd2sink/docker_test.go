package main

// Without local server binaries, the tests start PostgreSQL in Docker
// when a Docker engine answers (pgtest); the binary does not link that.
import _ "github.com/scd2sink/scd2sink/internal/pgtest/pgcontainer"
