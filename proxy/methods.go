package proxy

// methodKey identifies a method by class and method id in one comparable
// value, for the switches of the read loops.
type methodKey uint32

func keyOf(classID, methodID uint16) methodKey {
	return methodKey(classID)<<16 | methodKey(methodID)
}

// The methods the read loops act on; every other method passes through.
var (
	connectionClose   = keyOf(10, 50)
	connectionCloseOk = keyOf(10, 51)

	channelOpen    = keyOf(20, 10)
	channelClose   = keyOf(20, 40)
	channelCloseOk = keyOf(20, 41)

	basicConsume      = keyOf(60, 20)
	basicConsumeOk    = keyOf(60, 21)
	basicCancel       = keyOf(60, 30)
	basicCancelOk     = keyOf(60, 31)
	basicPublish      = keyOf(60, 40)
	basicDeliver      = keyOf(60, 60)
	basicGet          = keyOf(60, 70)
	basicGetOk        = keyOf(60, 71)
	basicGetEmpty     = keyOf(60, 72)
	basicAck          = keyOf(60, 80)
	basicReject       = keyOf(60, 90)
	basicRecoverAsync = keyOf(60, 100)
	basicRecover      = keyOf(60, 110)
	basicRecoverOk    = keyOf(60, 111)
	basicNack         = keyOf(60, 120)

	confirmSelect = keyOf(85, 10)

	txSelect     = keyOf(90, 10)
	txCommit     = keyOf(90, 20)
	txCommitOk   = keyOf(90, 21)
	txRollback   = keyOf(90, 30)
	txRollbackOk = keyOf(90, 31)
)
