// Package jsonscan reads the JSON text Debezium and Kafka Connect write,
// without decoding it into maps where it can: the members of an object in
// their order (ForEachMember), a schemaless row image visited member by
// member or decoded as encoding/json would (Visit, DecodeObject), and JSON
// rendered canonically, as jsonb compares it (Canon, AppendCanon).
//
// Invariants: every fast path agrees with its slow reference — gjson's
// ForEach, encoding/json with UseNumber, jsonb's printing — on every input
// it takes (the tests compare them over random documents), and hands
// anything else (invalid UTF-8, escaped surrogates, duplicate keys, deep
// nesting) to that reference instead of guessing. Strings handed out
// share the caller's bytes, which nobody writes to; nothing here keeps
// them.
package jsonscan
