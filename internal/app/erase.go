package app

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/sink"
	"go.uber.org/zap"
)

// EraseRequest is what `scd2sink erase` was asked.
type EraseRequest struct {
	Table  string
	Keys   [][]string // each key's values, in key column order
	Reason string
	Lift   bool
}

// Erase removes every trace of the keys from the target's history (its
// live table, a rebuild's table and the tables a swap kept, their side
// and repair tables, the dead letters) and records the erasures, so that
// no writer stores the keys again until they are lifted (DESIGN.md
// section 12). With Lift it only allows the keys again. It prints one
// line per key, naming its hash, never the key.
func Erase(ctx context.Context, cfg *config.Config, opts Options, req EraseRequest, out io.Writer) error {
	log := opts.Logger
	if log == nil {
		log = zap.NewNop()
	}
	if len(cfg.ErasureKey) == 0 {
		return &config.Error{Key: "erasure_key_file", Msg: "is required to erase: the erasures are recorded as keyed hashes"}
	}
	pool, err := Pool(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	// The decoder of run: a dead letter's key is read as run reads it
	// (its schema, JSON or Avro through the registry).
	dec, err := Decoder(cfg, log.Named("decoder"))
	if err != nil {
		return err
	}
	s, err := commandSink(ctx, cfg, pool, dec, log)
	if err != nil {
		return err
	}
	// The tables a swap kept for queries still running hold the history
	// too, as does a rebuild's. A rebuild that starts or swaps while the
	// erasure runs may have written a key, before the erasure committed,
	// into a table that did not exist or had another name when it was
	// listed: the tables are listed again after each round (by oid and
	// name: a new table, and a swap's renames, change the list), and the
	// keys erased again while the list changes.
	var res sink.EraseResult
	seen := map[string]bool{}
	for round := 0; ; round++ {
		also, ids, err := keptTables(ctx, pool, cfg, req.Table)
		if err != nil {
			return err
		}
		grown := round == 0
		for _, id := range ids {
			grown = grown || !seen[id]
			seen[id] = true
		}
		if !grown || (round > 0 && req.Lift) {
			break
		}
		if round == 5 {
			printErased(out, req, res)
			return fmt.Errorf("erasing from %s: its tables changed in each of 5 rounds (a rebuild swapping again and again?); the keys are erased from those listed, run erase again once the rebuild is done", req.Table)
		}
		r, err := s.Erase(ctx, sink.EraseRequest{Target: req.Table, Keys: req.Keys, Reason: req.Reason, Lift: req.Lift, Also: also,
			DeadLetterTables: []string{cfg.Sink.DeadLetterTable, cfg.Sink.DeadLetterTable + RebuildSuffix}})
		if err != nil {
			return err
		}
		if opts.afterEraseRound != nil {
			opts.afterEraseRound(round)
		}
		if round == 0 {
			res = r
		} else {
			log.Warn("a rebuild created or swapped a table while the keys were erased: erased again", zap.String("table", req.Table))
			res.Add(r)
		}
	}
	printErased(out, req, res)
	return nil
}

// printErased prints one line per key erased (or lifted), by its hash.
func printErased(out io.Writer, req EraseRequest, res sink.EraseResult) {
	for _, e := range res.Keys {
		if req.Lift {
			fmt.Fprintf(out, "%s: erasure of key %s lifted: its events are stored again\n", req.Table, e.Hash[:16])
			continue
		}
		fmt.Fprintf(out, "%s: key %s erased: %d versions, %d side rows, %d repair audits, %d dead letters\n",
			req.Table, e.Hash[:16], e.Versions, e.SideRows, e.Repairs, e.DeadLetters)
	}
	if res.Headers > 0 {
		fmt.Fprintf(out, "%s: %d key-change headers naming an erased key taken out of other keys' dead letters\n", req.Table, res.Headers)
	}
	if n := len(res.UnreadDeadLetters); n > 0 {
		fmt.Fprintf(out, "%s: %d dead letters of the table have a key that could not be read (a record never decoded, a binary key); look at them: ids %s\n",
			req.Table, n, joinIDs(res.UnreadDeadLetters, 20))
	}
}

// keptTables lists the tables that hold target's history besides the
// live one and exist: a rebuild's table and those swaps kept for running
// queries. ids name them and the live table, by oid and name.
func keptTables(ctx context.Context, pool *pgxpool.Pool, cfg *config.Config, target string) (also, ids []string, err error) {
	rows, err := pool.Query(ctx, `SELECT c.relname, c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relkind IN ('r', 'p') AND (c.relname = $2 OR c.relname = $3 OR c.relname LIKE $4 OR c.relname LIKE $5)
			AND c.relname NOT LIKE '%\_scd\_events' AND c.relname NOT LIKE '%\_scd\_repairs' ORDER BY 1`,
		cfg.Postgres.Schema, target, RebuildTarget(target), likeEscape(target)+`\_\_replaced\_%`, `scd2sink\_replaced\_`+digest(target)+`\_%`)
	if err != nil {
		return nil, nil, fmt.Errorf("listing the tables a rebuild kept of %s: %w", target, err)
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		var oid uint32
		if err := rows.Scan(&name, &oid); err != nil {
			return nil, nil, err
		}
		ids = append(ids, fmt.Sprintf("%d %s", oid, name))
		if name != target {
			also = append(also, name)
		}
	}
	return also, ids, rows.Err()
}

func likeEscape(s string) string {
	return strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`).Replace(s)
}

func joinIDs(ids []int64, max int) string {
	var b strings.Builder
	for i, id := range ids {
		if i == max {
			fmt.Fprintf(&b, " … (%d more)", len(ids)-max)
			break
		}
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprint(&b, id)
	}
	return b.String()
}
