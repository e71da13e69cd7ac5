package pgtest

import (
	"context"
	"fmt"
	"net/url"

	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
)

// ContainerImage is the PostgreSQL image started when no local binaries exist.
const ContainerImage = "postgres:16-alpine"

// startContainer starts PostgreSQL in Docker through testcontainers-go; it
// fails at once when no Docker engine answers.
func startContainer(ctx context.Context) (*Cluster, error) {
	ctr, err := tcpostgres.Run(ctx, ContainerImage,
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
	u, err := url.Parse(dsn)
	if err != nil {
		_ = testcontainers.TerminateContainer(ctr)
		return nil, err
	}
	return &Cluster{base: u, stop: func() { _ = testcontainers.TerminateContainer(ctr) }, Kind: "PostgreSQL in Docker (" + ContainerImage + ")"}, nil
}
