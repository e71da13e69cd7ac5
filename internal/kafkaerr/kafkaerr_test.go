package kafkaerr

import (
	"errors"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
)

func TestPlain(t *testing.T) {
	refused := errors.New("dial tcp 10.0.0.1:9092: connect: connection refused")
	cases := []struct {
		name string
		err  error
		want string
	}{
		{"other", refused, refused.Error()},
		{"one shard", &kadm.ShardErrors{Name: "DescribeGroups", Errs: []kadm.ShardError{{Broker: kadm.BrokerDetail{Host: "kafka-0"}, Err: refused}}},
			"broker kafka-0: dial tcp 10.0.0.1:9092: connect: connection refused"},
		{"two shards", &kadm.ShardErrors{Name: "ListOffsets", Errs: []kadm.ShardError{{Broker: kadm.BrokerDetail{Host: "kafka-0"}, Err: refused}, {Err: refused}}},
			"(and 1 more brokers)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := Plain(c.err)
			if !strings.Contains(got.Error(), c.want) || strings.Contains(got.Error(), "shard") || !errors.Is(got, refused) {
				t.Fatalf("Plain: %v, want %q", got, c.want)
			}
		})
	}
}
