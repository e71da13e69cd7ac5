// Package pgcontainer lets pgtest start PostgreSQL in Docker through
// testcontainers-go when a machine has no local server binaries. Test
// packages import it for its effect (a blank import); the scd2sink binary
// does not, so it links neither testcontainers nor a Docker client.
package pgcontainer

import (
	"context"
	"fmt"

	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
)

// Image is the PostgreSQL image started when no local binaries exist.
const Image = "postgres:16-alpine"

func init() { pgtest.RegisterContainer(start) }

// start starts PostgreSQL in Docker; it fails at once when no Docker
// engine answers.
func start(ctx context.Context) (*pgtest.Cluster, error) {
	ctr, err := tcpostgres.Run(ctx, Image,
		tcpostgres.WithDatabase("postgres"), tcpostgres.WithUsername("postgres"), tcpostgres.WithPassword("postgres"),
		tcpostgres.BasicWaitStrategies(),
		testcontainers.WithCmdArgs("-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "max_connections=200"))
	if err != nil {
		return nil, fmt.Errorf("starting PostgreSQL in Docker: %w", err)
	}
	dsn, err := ctr.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		_ = testcontainers.TerminateContainer(ctr)
		return nil, err
	}
	c, err := pgtest.External(dsn, func() { _ = testcontainers.TerminateContainer(ctr) }, "PostgreSQL in Docker ("+Image+")")
	if err != nil {
		_ = testcontainers.TerminateContainer(ctr)
		return nil, err
	}
	return c, nil
}
