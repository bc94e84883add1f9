package integration

import "os"

// longTierVariable, set to 1, runs the long tier: the acceptance runs that repeat a fault
// many times or move a large backlog run at full size (make test-long). The default tier
// runs the same tests, proving the same behaviour, at a smaller size, so that the whole
// suite fits a contributor's two-core machine.
const longTierVariable = "AMQP_MIRROR_TEST_LONG"

// bySize is short in the default tier and long in the long tier.
func bySize[T any](short, long T) T {
	if os.Getenv(longTierVariable) == "1" {
		return long
	}
	return short
}
