// Package fetch bounds the memory franz-go holds ahead of the consumer's
// reorder buffer: the fetch size (Budget, MaxConcurrent, PartitionMax and
// Sizer, which lowers the size asked of Kafka as batches compress more)
// and the pools that decompressed batches and decoded records are taken
// from and given back to (DecompressPool, RecordsPool).
//
// Invariants: what one fetch holds once decompressed stays near Budget
// (a fetch of batches more compressed than the ratio Sizer last saw holds
// more, by their ratio over it), and never less than fetchFloor is asked
// for, so a fetch always makes progress; a pooled buffer or slice is only
// handed out again after franz-go gave it back, that is after every
// record viewing it was recycled, and nothing decoded keeps a record's
// bytes.
//
// The state kept is enough: Sizer needs only the bytes read since it last
// set the size, by compression ratio, to pick the next size; the pools
// need only, per size class, what batches of that class decompressed to
// lately (a mean and a decaying maximum) to size a buffer, and sync.Pool
// frees what stays unused. Losing any of it (a restart) only costs a few
// fetches of the default size and a few buffers made to measure.
package fetch
