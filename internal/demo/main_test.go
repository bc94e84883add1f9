package demo

import (
	"testing"

	"github.com/amqp-mirror/amqp-mirror/internal/leaktest"
)

func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }
