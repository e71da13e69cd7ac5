package maint

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/scd2sink/scd2sink/sink/catalog"
)

// Violation is one broken history invariant.
type Violation struct {
	Table string // the history table, schema-qualified
	Check string // which invariant
	Key   string // the business key, as a JSON array
	Info  string // the offending versions
	// More, on the last violation of a check that had more than
	// MaxViolationsListed, is how many were not listed; that line stands
	// for them and is not one itself.
	More int64
}

// String formats the violation for people.
func (v Violation) String() string {
	return fmt.Sprintf("%s: %s: key %s: %s", v.Table, v.Check, v.Key, v.Info)
}

// Verify checks the invariants of DESIGN.md section 5 on the history table of
// target: at most one current version per key; is_current exactly when
// valid_to is NULL; valid_from <= valid_to; versions of a key never
// overlap; (key, scd_seq) unique. It returns every violation found.
func (m *Maint) Verify(ctx context.Context, target string) ([]Violation, error) {
	spec, ok := m.w.Spec(target)
	if !ok {
		return nil, fmt.Errorf("verifying %s: no such table is configured", target)
	}
	hist := pgx.Identifier{spec.Schema, spec.Target}.Sanitize()
	n := catalog.NamesOf(spec.Target)
	var cat *catalog.Catalog
	_, err := m.cfg.Retry(ctx, "verify", "reading the catalog of "+hist, func(ctx context.Context) (err error) {
		cat, err = catalog.ReadCatalog(ctx, m.pool, spec.Schema, []string{n.Hist, n.Side, n.Repairs, n.Current, n.KeyIndex, n.SideIndex, n.OldSideIndex, n.Hist + catalog.DirSuffix, n.Exclusion},
			n.AsOf, n.Hist)
		return err
	})
	if err != nil {
		return nil, err
	}
	if !cat.Has(n.Hist) {
		return nil, nil // the table does not exist yet
	}
	if len(spec.Keys) == 0 {
		var keys []string
		if _, err := m.cfg.Retry(ctx, "verify", "reading the key of "+hist, func(ctx context.Context) (err error) {
			keys, err = catalog.KeyColumns(ctx, m.pool, spec.Schema, spec.Target)
			return err
		}); err != nil {
			return nil, err
		}
		spec.Keys = keys
	}
	missing, columns := structure(hist, spec, cat)
	if columns {
		return missing, nil // the invariants cannot be read without the columns
	}
	keys := catalog.QuoteIdents(spec.Keys)
	keyJSON := "json_build_array(" + keys + ")::text"
	checks := []struct{ name, sql string }{
		{"more than one current version", fmt.Sprintf(
			`SELECT %s, 'scd_id ' || string_agg(scd_id::text, ', ' ORDER BY scd_id) FROM %s WHERE is_current GROUP BY %s HAVING count(*) > 1`,
			keyJSON, hist, keys)},
		{"is_current disagrees with valid_to", fmt.Sprintf(
			`SELECT %s, format('scd_id %%s is_current %%s valid_to %%s', scd_id, is_current, coalesce(valid_to::text, 'NULL')) FROM %s
			 WHERE is_current IS DISTINCT FROM (valid_to IS NULL)`, keyJSON, hist)},
		{"valid_from after valid_to", fmt.Sprintf(
			`SELECT %s, format('scd_id %%s [%%s, %%s)', scd_id, valid_from, valid_to) FROM %s WHERE valid_to < valid_from`, keyJSON, hist)},
		{"overlapping versions", fmt.Sprintf(
			`SELECT k, format('scd_id %%s [%%s, %%s) overlaps scd_id %%s from %%s', scd_id, valid_from, coalesce(valid_to::text, 'open'), next_id, next_from)
			 FROM (SELECT %s AS k, scd_id, valid_from, valid_to,
			         lead(scd_id) OVER w AS next_id, lead(valid_from) OVER w AS next_from
			       FROM %s WINDOW w AS (PARTITION BY %s ORDER BY valid_from, scd_seq)) v
			 WHERE next_id IS NOT NULL AND (valid_to IS NULL OR valid_to > next_from)`, keyJSON, hist, keys)},
		{"duplicate (key, scd_seq)", fmt.Sprintf(
			`SELECT %s, 'scd_id ' || string_agg(scd_id::text, ', ' ORDER BY scd_id) FROM %s GROUP BY %s, scd_seq HAVING count(*) > 1`,
			keyJSON, hist, keys)},
	}
	if cat.Rels[n.Hist] == 'p' {
		// A partitioned table's unique index on scd_id includes the
		// partition keys: one scd_id in two partitions is not refused.
		checks = append(checks, struct{ name, sql string }{"duplicate scd_id", fmt.Sprintf(
			`SELECT min(%s), format('scd_id %%s in %%s rows', scd_id, count(*)) FROM %s GROUP BY scd_id HAVING count(*) > 1`, keyJSON, hist)})
	}
	if cat.Rels[n.Hist] == 'p' {
		dir := pgx.Identifier{spec.Schema, n.Hist + catalog.DirSuffix}.Sanitize()
		if !cat.Has(n.Hist + catalog.DirSuffix) {
			missing = append(missing, Violation{Table: hist, Check: "missing key directory " + n.Hist + catalog.DirSuffix, Key: "-",
				Info: "restart scd2sink run: it creates it from the table"})
		} else {
			// Keys without a current version are looked up through the key
			// directory (catalog.partDir): one missing from it would be taken
			// for a key never seen.
			var match []string
			for _, k := range spec.Keys {
				q := pgx.Identifier{k}.Sanitize()
				match = append(match, fmt.Sprintf("x.%s = o.%s", q, q))
			}
			m := strings.Join(match, " AND ")
			checks = append(checks, struct{ name, sql string }{"key without a current version missing from the key directory", fmt.Sprintf(
				`SELECT %s, format('latest version scd_id %%s closed at %%s; directory: %%s', o.scd_id, o.valid_to,
					coalesce((SELECT 'bound ' || x.last_to::text FROM %s x WHERE %s), 'no row'))
				 FROM (SELECT DISTINCT ON (%s) * FROM %s ORDER BY %s, scd_seq DESC) o
				 WHERE NOT EXISTS (SELECT 1 FROM %s x WHERE %s) AND NOT EXISTS (SELECT 1 FROM %s x WHERE %s AND x.last_to <= o.valid_to)`,
				keyJSON, dir, m, keys, pgx.Identifier{spec.Schema, spec.Target + "_pold"}.Sanitize(), keys,
				pgx.Identifier{spec.Schema, spec.Target + "_pcur"}.Sanitize(), m, dir, m)})
		}
	}
	if cat.HasCol(n.Hist, "scd_deleted") {
		// deletes: new_record: a version marked deleted is one a delete
		// opened, right where it closed the version before it (that one
		// may be gone to retention).
		checks = append(checks, struct{ name, sql string }{"scd_deleted disagrees with scd_op", fmt.Sprintf(
			`SELECT %s, format('scd_id %%s scd_deleted %%s scd_op %%s', scd_id, scd_deleted, scd_op) FROM %s
			 WHERE scd_deleted IS DISTINCT FROM (scd_op = 'd')`, keyJSON, hist)},
			struct{ name, sql string }{"deleted version not opened where a version closed", fmt.Sprintf(
				`SELECT k, format('scd_id %%s from %%s follows scd_id %%s (deleted %%s) to %%s', scd_id, valid_from, prev_id, prev_deleted, coalesce(prev_to::text, 'open'))
			 FROM (SELECT %s AS k, scd_id, valid_from, scd_deleted, lag(scd_id) OVER w AS prev_id, lag(scd_deleted) OVER w AS prev_deleted,
			         lag(valid_to) OVER w AS prev_to
			       FROM %s WINDOW w AS (PARTITION BY %s ORDER BY scd_seq)) v
			 WHERE scd_deleted AND prev_id IS NOT NULL AND (prev_deleted OR prev_to IS DISTINCT FROM valid_from)`, keyJSON, hist, keys)})
	}
	var out []Violation
	_, err = m.cfg.Retry(ctx, "verify", "verifying "+hist, func(ctx context.Context) error {
		out = append([]Violation(nil), missing...)
		if err := m.verify(ctx, hist, checks, &out); err != nil {
			return err
		}
		erased, err := m.w.ErasedViolations(ctx, spec, hist)
		out = append(out, erased...)
		return err
	})
	return out, err
}

// structure reports what the sink relies on and the catalog lacks: the
// bookkeeping and key columns, the key and scd_id indexes, the side table
// with its columns and index, the repair audit, _current and _as_of (a
// table or index dropped or changed by hand); columns reports whether a
// column of the history table itself is missing.
func structure(hist string, spec catalog.TableSpec, cat *catalog.Catalog) (out []Violation, columns bool) {
	n := catalog.NamesOf(spec.Target)
	missing := func(what string) {
		out = append(out, Violation{Table: hist, Check: "missing " + what, Key: "-", Info: "restore it, or restart scd2sink run to create it again"})
	}
	if len(spec.Keys) == 0 {
		missing(fmt.Sprintf("index %s (it names the key columns)", n.KeyIndex))
		return out, true
	}
	for _, c := range append(append([]string(nil), spec.Keys...), catalog.Bookkeeping...) {
		if !cat.HasCol(n.Hist, catalog.Ident(c)) {
			missing("column " + c)
			columns = true
		}
	}
	if !cat.Has(n.KeyIndex) {
		missing("unique index " + n.KeyIndex + " on (key, scd_seq)")
	}
	if !cat.SCDIDUnique {
		missing("unique index on scd_id")
	}
	if !cat.Has(n.Side) {
		missing("side table " + n.Side)
	} else {
		for _, c := range cat.Cols[n.Hist] {
			if (!catalog.IsBookkeeping(c) || c == "scd_seq" || c == "scd_op" || c == "scd_hash" || c == "scd_unavailable" || c == "scd_absent" || c == "scd_raw_t" || c == "scd_attnum") && !cat.HasCol(n.Side, c) {
				missing("column " + c + " of " + n.Side)
			}
		}
		if !cat.Has(n.SideIndex) && !cat.Has(n.OldSideIndex) {
			missing("unique index " + n.SideIndex + " of " + n.Side)
		}
	}
	if !cat.Has(n.Repairs) {
		missing("repair audit " + n.Repairs)
	}
	if spec.NoOverlap && !cat.Has(n.Exclusion) {
		out = append(out, Violation{Table: hist, Check: "missing no-overlap constraint " + n.Exclusion, Key: "-",
			Info: "history_constraint: no_overlap: scd2sink run adds it once btree_gist exists and no versions overlap"})
	}
	if !cat.Has(n.Current) {
		missing("view " + n.Current)
	}
	if !cat.AsOf {
		missing("function " + n.AsOf + "(timestamptz)")
	}
	return out, columns
}

// MaxViolationsListed is how many violations of one check Verify lists;
// the rest are counted in one more Violation ("… more"), so that what
// verify holds does not grow with a broken table.
const MaxViolationsListed = 1000

// verify runs checks, streaming each one's rows: at most
// MaxViolationsListed are kept per check, the rest only counted.
func (m *Maint) verify(ctx context.Context, hist string, checks []struct{ name, sql string }, out *[]Violation) error {
	for _, c := range checks {
		rows, err := m.pool.Query(ctx, c.sql)
		if err != nil {
			return fmt.Errorf("verifying %s (%s): %w", hist, c.name, err)
		}
		n := 0
		for rows.Next() {
			if n++; n > MaxViolationsListed {
				continue
			}
			v := Violation{Table: hist, Check: c.name}
			if err := rows.Scan(&v.Key, &v.Info); err != nil {
				rows.Close()
				return err
			}
			*out = append(*out, v)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("verifying %s (%s): %w", hist, c.name, err)
		}
		if n > MaxViolationsListed {
			*out = append(*out, Violation{Table: hist, Check: c.name, Key: "-", More: int64(n - MaxViolationsListed),
				Info: fmt.Sprintf("%d more violations of this check not listed (the first %d are)", n-MaxViolationsListed, MaxViolationsListed)})
		}
	}
	return nil
}
