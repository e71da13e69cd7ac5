package debezium

// SetAvroWhole makes Decoders built from now on decode every Avro envelope
// through goavro's maps (true) or through the envelope plan (false).
func SetAvroWhole(whole bool) (restore func()) {
	old := avroWhole
	avroWhole = whole
	return func() { avroWhole = old }
}
