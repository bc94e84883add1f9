// Package frames is the AMQP 0-9-1 wire format as RabbitMQ speaks it: a frame
// reader and writer, every method of the RabbitMQ-extended spec as a Go type,
// field tables and content-header properties.
//
// It is a leaf package (stdlib only). The method types, reply codes and the
// table of which peer may send which method are generated from the spec XML
// kept in internal/spec; edit that, not methods_gen.go.
//
// Two rules shape the API:
//
//   - Decode from bounded slices. A frame is read whole into a reused buffer
//     after its size has been checked, and every decoder walks a slice with
//     explicit bounds checks and fails when bytes are left over.
//   - Decode only what you act on. Frame.Payload is the raw bytes; a proxy can
//     forward it untouched, read just a method id (ParseMethodID), a body size
//     (HeaderBodySize) or the headers table's position (HeadersField), and
//     decode a full method only when it must.
//
// Decoded values never alias the reader's buffer (strings are copied), but
// decoding into a reused struct keeps strings and table values that did not
// change, so that the steady state allocates nothing.
//
// Every protocol error is a *Error carrying the AMQP reply code; transport
// errors from the underlying io.Reader/io.Writer are returned as they came.
package frames

//go:generate go run ./internal/specgen -spec internal/spec/amqp0-9-1.stripped.extended.xml -spec internal/spec/rabbitmq-extensions.xml -out methods_gen.go -samples methods_sample_gen_test.go
