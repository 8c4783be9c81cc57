package api

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// The frames of the changes stream (GET /overlay-master/changes/stream).
//
// A stream is a sequence of frames, each a header line and a payload:
//
//	KIND LENGTH\n
//	PAYLOAD (LENGTH bytes)
//
// KIND is FrameChanges (an api.Changes, JSON, exactly as the long poll
// answers it), FrameChangesGzip (the same, gzip'ed: sent to a client that
// accepts gzip when the JSON is large), FrameHeartbeat (a StreamHeartbeat)
// or FrameEnd (an Error, the stream's last frame: why the master ends
// it). A reader skips kinds it does not know, so that later masters may
// add some. The length prefix lets a master write one encoded payload to
// every stream at the same index as it is (encode once, write many), and a
// reader bound what it reads before it reads it.

// Frame kinds of the changes stream.
const (
	FrameChanges     = "changes"
	FrameChangesGzip = "changes-gzip"
	FrameHeartbeat   = "heartbeat"
	FrameEnd         = "end"
)

// maxFrameHeader bounds a frame's header line (kind, a space, a length,
// a newline).
const maxFrameHeader = 64

// MaxFrameBytes bounds a frame's payload, and a gzip'ed one's JSON, as
// MaxAnswerBytes bounds an answer: a frame of every record at 50,000
// agents is a few tens of MB.
const MaxFrameBytes = MaxAnswerBytes

// ErrBadFrame marks a stream that is not a sequence of frames: the
// connection is to be dropped (and the stream opened again).
var ErrBadFrame = errors.New("malformed changes stream frame")

// StreamHeartbeat is the payload of a heartbeat frame: the master is alive
// and its state is at Index (nothing changed since the last changes frame,
// or the changes wait for their round).
type StreamHeartbeat struct {
	Index uint64 `json:"index"`
}

// Frame is one decoded frame of a changes stream: Changes for a changes
// frame (either encoding), Heartbeat for a heartbeat, End for the last.
type Frame struct {
	Kind      string
	Changes   *Changes
	Heartbeat *StreamHeartbeat
	End       *Error
}

// AppendFrameHeader appends the header line of a frame of kind with a
// payload of n bytes.
func AppendFrameHeader(dst []byte, kind string, n int) []byte {
	dst = append(dst, kind...)
	dst = append(dst, ' ')
	dst = strconv.AppendInt(dst, int64(n), 10)
	return append(dst, '\n')
}

// AppendFrame appends a whole frame: its header and payload.
func AppendFrame(dst []byte, kind string, payload []byte) []byte {
	return append(AppendFrameHeader(dst, kind, len(payload)), payload...)
}

// FrameReader decodes the frames of a changes stream. Its input comes
// from the network: every bound is checked before anything is allocated
// for it, and nothing in it panics.
type FrameReader struct {
	r *bufio.Reader
}

// NewFrameReader returns a reader of the frames in r.
func NewFrameReader(r io.Reader) *FrameReader {
	return &FrameReader{r: bufio.NewReaderSize(r, 4096)}
}

// Next returns the next frame of a kind it knows; io.EOF at a clean end
// between frames, an error wrapping ErrBadFrame for a stream that is not
// frames, or the read's error (io.ErrUnexpectedEOF for a cut frame).
func (f *FrameReader) Next() (Frame, error) {
	for {
		kind, n, err := f.header()
		if err != nil {
			return Frame{}, err
		}
		payload, err := io.ReadAll(io.LimitReader(f.r, int64(n)))
		if err != nil {
			return Frame{}, fmt.Errorf("read a %s frame: %w", kind, err)
		}
		if len(payload) < n {
			return Frame{}, fmt.Errorf("read a %s frame: %d of %d bytes: %w", kind, len(payload), n, io.ErrUnexpectedEOF)
		}
		fr, known, err := decodeFrame(kind, payload)
		if err != nil {
			return Frame{}, err
		}
		if known {
			return fr, nil
		}
	}
}

// header reads a frame's header line.
func (f *FrameReader) header() (string, int, error) {
	var line []byte
	for {
		b, err := f.r.ReadByte()
		if err != nil {
			if errors.Is(err, io.EOF) && len(line) > 0 {
				return "", 0, fmt.Errorf("read a frame header: %w", io.ErrUnexpectedEOF)
			}
			return "", 0, err
		}
		if b == '\n' {
			break
		}
		if len(line) >= maxFrameHeader {
			return "", 0, fmt.Errorf("%w: a header line longer than %d bytes", ErrBadFrame, maxFrameHeader)
		}
		line = append(line, b)
	}
	kind, size, ok := strings.Cut(string(line), " ")
	if !ok || kind == "" {
		return "", 0, fmt.Errorf("%w: header %q: want \"KIND LENGTH\"", ErrBadFrame, line)
	}
	n, err := strconv.ParseUint(size, 10, 64)
	if err != nil || n > MaxFrameBytes {
		return "", 0, fmt.Errorf("%w: header %q: want a length up to %d", ErrBadFrame, line, MaxFrameBytes)
	}
	return kind, int(n), nil
}

// decodeFrame decodes a frame's payload; false for a kind it does not know.
func decodeFrame(kind string, payload []byte) (Frame, bool, error) {
	fr := Frame{Kind: kind}
	switch kind {
	case FrameChanges, FrameChangesGzip:
		if kind == FrameChangesGzip {
			var err error
			if payload, err = gunzipFrame(payload); err != nil {
				return Frame{}, false, err
			}
			fr.Kind = FrameChanges
		}
		fr.Changes = &Changes{}
		if err := json.Unmarshal(payload, fr.Changes); err != nil {
			return Frame{}, false, fmt.Errorf("%w: changes: %w", ErrBadFrame, describeJSONError(err))
		}
	case FrameHeartbeat:
		fr.Heartbeat = &StreamHeartbeat{}
		if err := json.Unmarshal(payload, fr.Heartbeat); err != nil {
			return Frame{}, false, fmt.Errorf("%w: heartbeat: %w", ErrBadFrame, describeJSONError(err))
		}
	case FrameEnd:
		fr.End = &Error{}
		if err := json.Unmarshal(payload, fr.End); err != nil {
			return Frame{}, false, fmt.Errorf("%w: end: %w", ErrBadFrame, describeJSONError(err))
		}
		if fr.End.Code == "" {
			fr.End.Code = CodeInternal
		}
	default:
		return Frame{}, false, nil
	}
	return fr, true, nil
}

// gunzipFrame inflates a gzip'ed payload, at most MaxFrameBytes of it.
func gunzipFrame(payload []byte) ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(payload))
	if err != nil {
		return nil, fmt.Errorf("%w: changes-gzip: %w", ErrBadFrame, err)
	}
	out, err := io.ReadAll(io.LimitReader(zr, MaxFrameBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%w: changes-gzip: %w", ErrBadFrame, err)
	}
	if len(out) > MaxFrameBytes {
		return nil, fmt.Errorf("%w: changes-gzip inflates beyond %d bytes", ErrBadFrame, MaxFrameBytes)
	}
	return out, nil
}

// StreamPath is the route of the changes stream.
const StreamPath = "/overlay-master/changes/stream"

// DefaultStreamHeartbeat is how often a master sends a heartbeat frame on
// a stream where nothing changes, unless the client asks otherwise.
const DefaultStreamHeartbeat = 15 * time.Second

// Bounds of the heartbeat a stream asks for (apiclient.StreamOptions.Heartbeat,
// the query's heartbeat; the master refuses others with 400).
const (
	MinStreamHeartbeat = 100 * time.Millisecond
	MaxStreamHeartbeat = 5 * time.Minute
)
