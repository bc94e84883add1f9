package config

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// AdminTokenFile is the name of the generated admin token inside state_dir.
const AdminTokenFile = "admin.token"

// AdminTokenPath returns where the generated token lives.
func AdminTokenPath(cfg *Config) string { return filepath.Join(cfg.StateDir, AdminTokenFile) }

// EnsureAdminToken returns the admin API token for the server: admin_token
// when set, otherwise the token in state_dir/admin.token, generated (32
// random bytes, hex, mode 0600) on first start and reused afterwards, like
// RabbitMQ's Erlang cookie.
func EnsureAdminToken(cfg *Config) (string, error) {
	if cfg.AdminToken != "" {
		return cfg.AdminToken, nil
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return "", fmt.Errorf("state_dir: %w", err)
	}
	path := AdminTokenPath(cfg)
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", err
	}
	token := hex.EncodeToString(raw[:])
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return readToken(path)
	}
	if err != nil {
		return "", err
	}
	if _, err := f.WriteString(token + "\n"); err != nil {
		f.Close()
		os.Remove(path)
		return "", err
	}
	if err := f.Close(); err != nil {
		return "", err
	}
	return token, nil
}

// LoadAdminToken returns the token ctl presents: admin_token when set,
// otherwise the content of state_dir/admin.token. It never creates one.
func LoadAdminToken(cfg *Config) (string, error) {
	if cfg.AdminToken != "" {
		return cfg.AdminToken, nil
	}
	return readToken(AdminTokenPath(cfg))
}

func readToken(path string) (string, error) {
	token, err := ReadSecretFile(path, "admin token")
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
		return "", fmt.Errorf("%w (is the proxy's state_dir readable from here?)", err)
	}
	return token, err
}
