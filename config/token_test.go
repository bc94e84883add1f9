package config

import (
	"os"
	"strings"
	"testing"
)

func TestAdminToken(t *testing.T) {
	cfg := &Config{StateDir: t.TempDir()}
	if _, err := LoadAdminToken(cfg); err == nil {
		t.Error("LoadAdminToken before the server generated one: got no error")
	}
	first, err := EnsureAdminToken(cfg)
	if err != nil || len(first) != 64 {
		t.Fatalf("EnsureAdminToken: %q, %v", first, err)
	}
	st, err := os.Stat(AdminTokenPath(cfg))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("token file: %v %v, want mode 0600", st, err)
	}
	again, err := EnsureAdminToken(cfg)
	if err != nil || again != first {
		t.Errorf("second start: got %q, %v; want the same token", again, err)
	}
	read, err := LoadAdminToken(cfg)
	if err != nil || read != first {
		t.Errorf("LoadAdminToken: got %q, %v; want the generated token", read, err)
	}
	if err := os.Chmod(AdminTokenPath(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadAdminToken(cfg); err == nil || !strings.Contains(err.Error(), "are too open") {
		t.Errorf("world-readable token: got %v", err)
	}
	cfg.AdminToken = "configured"
	if got, _ := EnsureAdminToken(cfg); got != "configured" {
		t.Errorf("configured token: got %q", got)
	}
}
