package cluster

import (
	"net"
	"testing"
)

// answering is what keeps a proxy from pausing when serf declares a live
// but starved peer failed: the kernel completes the handshake for a
// listening port, whatever the process behind it is doing.
func TestAnsweringCountsMembersWhoseRaftPortAccepts(t *testing.T) {
	listening, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer listening.Close() // never accepts: the backlog completes the handshake
	gone, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	goneAddr := gone.Addr().String()
	gone.Close()
	alive := Member{Name: "rabbit2", Raft: listening.Addr().String()}
	dead := Member{Name: "rabbit3", Raft: goneAddr}
	cases := []struct {
		name    string
		members []Member
		want    int
	}{
		{"no failed members", nil, 0},
		{"a listening raft port answers", []Member{alive}, 1},
		{"a closed raft port does not", []Member{dead}, 0},
		{"no raft address does not", []Member{{Name: "rabbit4"}}, 0},
		{"each is asked", []Member{alive, dead, alive}, 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := answering(c.members); got != c.want {
				t.Errorf("answering(%v) = %d, want %d", c.members, got, c.want)
			}
		})
	}
}
