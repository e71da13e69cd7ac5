package plan

// TargetError is a failure that belongs to one target: a statement on its
// tables failed (a lock or statement timeout, a table changed by hand, a
// missing privilege, schema_changes: fail, a value isolation could not
// resolve). The consumer parks that target's partitions and lets the
// others go on (DESIGN.md section 6: one table's trouble stays in its
// table); see ParkTarget.
type TargetError struct {
	Target string
	Err    error
}

// Error is the underlying error's text (it names the table).
func (e *TargetError) Error() string { return e.Err.Error() }

// Unwrap returns the underlying error.
func (e *TargetError) Unwrap() error { return e.Err }
