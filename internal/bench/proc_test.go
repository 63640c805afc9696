package bench

import (
	"fmt"
	"net"
	"os"
	"testing"
)

// socketInodes finds a listening socket by its local port (listenerPID's
// use) and an established connection by its remote port (the soak's count
// of the relay's database connections), and nothing on a port in neither
// state.
func TestSocketInodes(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	self := fmt.Sprintf("/proc/%d/net", os.Getpid())
	if n := len(socketInodes("/proc/net", localAddr, port, tcpListen)); n != 1 {
		t.Errorf("listening sockets on %d: %d, want 1", port, n)
	}
	if n := len(socketInodes(self, remoteAddr, port, tcpEstablished)); n != 1 {
		t.Errorf("connections to %d: %d, want 1", port, n)
	}
	if n := len(socketInodes(self, remoteAddr, port, tcpListen)); n != 0 {
		t.Errorf("listening sockets with remote port %d: %d, want 0", port, n)
	}
	if pid := listenerPID(port); pid != os.Getpid() {
		t.Errorf("listenerPID(%d) = %d, want this process %d", port, pid, os.Getpid())
	}
}
