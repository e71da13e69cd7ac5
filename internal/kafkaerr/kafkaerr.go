// Package kafkaerr says Kafka's admin errors in plain words: franz-go
// reports a request sent to several brokers as "request X has N separate
// shard errors", which names the client's internals and hides the cause.
package kafkaerr

import (
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
)

// Plain is err with a sharded request's errors replaced by the first
// one's cause (and how many more failed); other errors are unchanged.
func Plain(err error) error {
	var shards *kadm.ShardErrors
	if !errors.As(err, &shards) || len(shards.Errs) == 0 {
		return err
	}
	first := shards.Errs[0]
	if len(shards.Errs) == 1 {
		return fmt.Errorf("broker %s: %w", first.Broker.Host, first.Err)
	}
	return fmt.Errorf("broker %s: %w (and %d more brokers)", first.Broker.Host, first.Err, len(shards.Errs)-1)
}
