// Package ctl is the control protocol between softrnicd and its clients: a
// versioned request/reply protocol over a Unix SOCK_SEQPACKET socket, one
// message per packet, file descriptors passed as SCM_RIGHTS.
//
// Every message starts with a 16-octet header:
//
//	magic "SR" (2) | version (2) | op (2) | flags (2) | request id (4) | status (4)
//
// followed by the body of the op: the fields of the op's Go struct in
// declaration order, big-endian, unsigned integers at their width, bools as
// one octet, strings and byte slices as a 16-bit length and the octets, and
// fixed arrays of such. A reply echoes the request id and op and carries a
// DAT-style status; a failed reply's body is the error message. The daemon
// decodes every message defensively: truncated, oversized or trailing input
// is an error, never a panic.
package ctl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"reflect"
)

// Protocol constants. Version changes with any message's layout (the codec
// has no optional fields): 6 added EPReply.QPN and ConnectQP.
const (
	Magic      = 0x5352 // "SR"
	Version    = 7
	HeaderLen  = 16
	MaxMessage = 64 << 10
	// MaxBytes bounds one string or byte-slice field.
	MaxBytes = 4096
)

// Header is the fixed start of every message.
type Header struct {
	Op     Op
	Flags  uint16
	ID     uint32
	Status Status
}

// ErrMalformed is any decoding failure.
var ErrMalformed = errors.New("ctl: malformed message")

// Marshal encodes a header and a body struct (pointer or value).
func Marshal(h Header, body any) ([]byte, error) {
	b := make([]byte, HeaderLen, 256)
	binary.BigEndian.PutUint16(b[0:], Magic)
	binary.BigEndian.PutUint16(b[2:], Version)
	binary.BigEndian.PutUint16(b[4:], uint16(h.Op))
	binary.BigEndian.PutUint16(b[6:], h.Flags)
	binary.BigEndian.PutUint32(b[8:], h.ID)
	binary.BigEndian.PutUint32(b[12:], uint32(h.Status))
	if body != nil {
		var err error
		if b, err = encodeValue(b, reflect.Indirect(reflect.ValueOf(body))); err != nil {
			return nil, err
		}
	}
	if len(b) > MaxMessage {
		return nil, fmt.Errorf("ctl: message of %d octets over %d", len(b), MaxMessage)
	}
	return b, nil
}

// ParseHeader checks and decodes the header; it returns the body.
func ParseHeader(b []byte) (Header, []byte, error) {
	if len(b) < HeaderLen {
		return Header{}, nil, fmt.Errorf("%w: %d octets", ErrMalformed, len(b))
	}
	if binary.BigEndian.Uint16(b) != Magic {
		return Header{}, nil, fmt.Errorf("%w: bad magic", ErrMalformed)
	}
	if v := binary.BigEndian.Uint16(b[2:]); v != Version {
		return Header{}, nil, fmt.Errorf("%w: version %d, this side speaks %d", ErrMalformed, v, Version)
	}
	h := Header{
		Op:     Op(binary.BigEndian.Uint16(b[4:])),
		Flags:  binary.BigEndian.Uint16(b[6:]),
		ID:     binary.BigEndian.Uint32(b[8:]),
		Status: Status(binary.BigEndian.Uint32(b[12:])),
	}
	return h, b[HeaderLen:], nil
}

// Unmarshal decodes a body into the struct dst points to; the body must be
// consumed exactly.
func Unmarshal(body []byte, dst any) error {
	v := reflect.ValueOf(dst)
	if v.Kind() != reflect.Pointer || v.IsNil() {
		return errors.New("ctl: Unmarshal needs a non-nil pointer")
	}
	rest, err := decodeValue(body, v.Elem())
	if err != nil {
		return err
	}
	if len(rest) != 0 {
		return fmt.Errorf("%w: %d trailing octets", ErrMalformed, len(rest))
	}
	return nil
}

func encodeValue(b []byte, v reflect.Value) ([]byte, error) {
	switch v.Kind() {
	case reflect.Bool:
		if v.Bool() {
			return append(b, 1), nil
		}
		return append(b, 0), nil
	case reflect.Uint8:
		return append(b, uint8(v.Uint())), nil
	case reflect.Uint16:
		return binary.BigEndian.AppendUint16(b, uint16(v.Uint())), nil
	case reflect.Uint32:
		return binary.BigEndian.AppendUint32(b, uint32(v.Uint())), nil
	case reflect.Uint64:
		return binary.BigEndian.AppendUint64(b, v.Uint()), nil
	case reflect.Int32:
		return binary.BigEndian.AppendUint32(b, uint32(v.Int())), nil
	case reflect.Int64:
		return binary.BigEndian.AppendUint64(b, uint64(v.Int())), nil
	case reflect.String:
		return appendBytes(b, []byte(v.String()))
	case reflect.Slice:
		if v.Type().Elem().Kind() != reflect.Uint8 {
			return nil, fmt.Errorf("ctl: cannot encode %v", v.Type())
		}
		return appendBytes(b, v.Bytes())
	case reflect.Array:
		var err error
		for i := 0; i < v.Len(); i++ {
			if b, err = encodeValue(b, v.Index(i)); err != nil {
				return nil, err
			}
		}
		return b, nil
	case reflect.Struct:
		var err error
		for i := 0; i < v.NumField(); i++ {
			if b, err = encodeValue(b, v.Field(i)); err != nil {
				return nil, err
			}
		}
		return b, nil
	}
	return nil, fmt.Errorf("ctl: cannot encode %v", v.Type())
}

func appendBytes(b, s []byte) ([]byte, error) {
	if len(s) > MaxBytes {
		return nil, fmt.Errorf("ctl: field of %d octets over %d", len(s), MaxBytes)
	}
	b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...), nil
}

func need(b []byte, n int) error {
	if len(b) < n {
		return fmt.Errorf("%w: truncated", ErrMalformed)
	}
	return nil
}

func decodeValue(b []byte, v reflect.Value) ([]byte, error) {
	switch v.Kind() {
	case reflect.Bool:
		if err := need(b, 1); err != nil {
			return nil, err
		}
		if b[0] > 1 {
			return nil, fmt.Errorf("%w: bool %d", ErrMalformed, b[0])
		}
		v.SetBool(b[0] == 1)
		return b[1:], nil
	case reflect.Uint8:
		if err := need(b, 1); err != nil {
			return nil, err
		}
		v.SetUint(uint64(b[0]))
		return b[1:], nil
	case reflect.Uint16:
		if err := need(b, 2); err != nil {
			return nil, err
		}
		v.SetUint(uint64(binary.BigEndian.Uint16(b)))
		return b[2:], nil
	case reflect.Uint32, reflect.Int32:
		if err := need(b, 4); err != nil {
			return nil, err
		}
		x := binary.BigEndian.Uint32(b)
		if v.Kind() == reflect.Int32 {
			v.SetInt(int64(int32(x)))
		} else {
			v.SetUint(uint64(x))
		}
		return b[4:], nil
	case reflect.Uint64, reflect.Int64:
		if err := need(b, 8); err != nil {
			return nil, err
		}
		x := binary.BigEndian.Uint64(b)
		if v.Kind() == reflect.Int64 {
			v.SetInt(int64(x))
		} else {
			v.SetUint(x)
		}
		return b[8:], nil
	case reflect.String, reflect.Slice:
		if err := need(b, 2); err != nil {
			return nil, err
		}
		n := int(binary.BigEndian.Uint16(b))
		b = b[2:]
		if n > MaxBytes {
			return nil, fmt.Errorf("%w: field of %d octets", ErrMalformed, n)
		}
		if err := need(b, n); err != nil {
			return nil, err
		}
		if v.Kind() == reflect.String {
			v.SetString(string(b[:n]))
		} else {
			v.SetBytes(append([]byte(nil), b[:n]...))
		}
		return b[n:], nil
	case reflect.Array:
		var err error
		for i := 0; i < v.Len(); i++ {
			if b, err = decodeValue(b, v.Index(i)); err != nil {
				return nil, err
			}
		}
		return b, nil
	case reflect.Struct:
		var err error
		for i := 0; i < v.NumField(); i++ {
			if b, err = decodeValue(b, v.Field(i)); err != nil {
				return nil, err
			}
		}
		return b, nil
	}
	return nil, fmt.Errorf("ctl: cannot decode %v", v.Type())
}
