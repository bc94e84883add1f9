package config

import (
	"fmt"
	"io"
	"os"
	"strings"
)

// CheckPrivate refuses a file of secrets that group or others may read
// or write, as ssh refuses such a private key: the secret is only as good
// as the file's protection.
func CheckPrivate(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	return checkPrivate(st, path)
}

func checkPrivate(st os.FileInfo, path string) error {
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return fmt.Errorf("permissions %04o for %s are too open: it holds a secret that group and others must not reach (chmod 600 %s)", perm, path, path)
	}
	return nil
}

// ReadSecretFile reads a one-line secret (a token) from path, trimmed of
// surrounding whitespace, after CheckPrivate. Its errors start with what
// and never contain the secret.
func ReadSecretFile(path, what string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	if st.IsDir() {
		return "", fmt.Errorf("%s %s: expected a file, found a directory", what, path)
	}
	if err := checkPrivate(st, path); err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	b, err := io.ReadAll(io.LimitReader(f, 64<<10))
	if err != nil {
		return "", fmt.Errorf("%s %s: %w", what, path, err)
	}
	secret := strings.TrimSpace(string(b))
	if secret == "" {
		return "", fmt.Errorf("%s %s: expected a token, found an empty file", what, path)
	}
	return secret, nil
}
