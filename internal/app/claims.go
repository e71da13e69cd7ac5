package app

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/consumer"
)

// claimer records which topic writes a target (sink.Sink.Claim).
type claimer interface {
	Claim(ctx context.Context, target, topic string) (string, error)
}

// routeFunc is the consumer's Route: the router's answer for a topic and,
// for a topic a topic_pattern entry resolves, the claim of its target in
// scd2sink_targets, so that the members of a group agree on which of two
// new topics keeps a target (each resolves them in the order its own
// metadata shows them). Settled claims are remembered; a claim that
// cannot be asked (PostgreSQL away) is consumer.ErrUnsettled.
func routeFunc(router *config.Router, claims claimer) func(context.Context, string) error {
	var mu sync.Mutex
	claimed := map[string]bool{}
	return func(ctx context.Context, topic string) error {
		t, err := router.Match(topic)
		if errors.Is(err, config.ErrNoMatch) {
			return consumer.ErrIgnored
		}
		if err != nil || t.TopicPattern == "" {
			return err
		}
		mu.Lock()
		ok := claimed[topic]
		mu.Unlock()
		if ok {
			return nil
		}
		owner, err := claims.Claim(ctx, t.Target, topic)
		if err != nil {
			return fmt.Errorf("%w: %w", consumer.ErrUnsettled, err)
		}
		router.Own(t.Target, owner)
		if owner != topic {
			return fmt.Errorf("topic %s would write target %s, which topic %s writes already (recorded in scd2sink_targets: delete that row to hand the target over)",
				topic, t.Target, owner)
		}
		mu.Lock()
		claimed[topic] = true
		mu.Unlock()
		return nil
	}
}
