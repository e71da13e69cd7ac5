package app

import (
	"errors"
	"os"
	"strings"
	"sync"
	"time"
)

// fileSecret is a secret kept in a file that may be replaced while the
// service runs (a rotated token, a Kubernetes secret mount): it is read
// again when the file's modification time or size changes.
type fileSecret struct {
	path  string
	mu    sync.Mutex
	mod   time.Time
	size  int64
	value string
}

// get returns the file's current content, without trailing newlines.
func (f *fileSecret) get() (string, error) {
	st, err := os.Stat(f.path)
	if err != nil {
		return "", err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.value != "" && st.ModTime().Equal(f.mod) && st.Size() == f.size {
		return f.value, nil
	}
	raw, err := os.ReadFile(f.path)
	if err != nil {
		return "", err
	}
	v := strings.TrimRight(string(raw), "\r\n")
	if v == "" {
		return "", errors.New(f.path + " is empty")
	}
	f.value, f.mod, f.size = v, st.ModTime(), st.Size()
	return v, nil
}
