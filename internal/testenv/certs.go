package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// certValidity is how long the test certificates are valid; they are
// backdated by an hour, so a clock a little off does not matter.
const certValidity = 24 * time.Hour

// CA is a private certificate authority made at test time: its certificate
// and key live in the test's TempDir only, nothing is committed.
type CA struct {
	// CertFile is the CA certificate (PEM), the file a client or server is
	// given to verify the other side.
	CertFile string

	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	dir  string
}

// NewCA makes a CA (ECDSA P-256, self-signed) whose files go away with the
// test.
func NewCA(t testing.TB) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("testenv: CA key: %v", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: "outbox-relay test CA " + t.Name(), Organization: []string{"outbox-relay tests"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(certValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatalf("testenv: CA certificate: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("testenv: CA certificate: %v", err)
	}
	dir := t.TempDir()
	ca := &CA{cert: cert, key: key, dir: dir, CertFile: filepath.Join(dir, "ca.pem")}
	writePEM(t, ca.CertFile, "CERTIFICATE", der)
	return ca
}

// Issue makes a certificate signed by ca and its key and returns their PEM
// files. The first host is the subject's common name (the user name
// RabbitMQ takes from a client certificate with ssl_cert_login_from =
// common_name); every host is a subject alternative name, as an IP address
// when it parses as one. The certificate is good for both server and client
// authentication.
func (ca *CA) Issue(t testing.TB, hosts ...string) (certFile, keyFile string) {
	t.Helper()
	if len(hosts) == 0 {
		t.Fatal("testenv: Issue needs at least one host (the common name)")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("testenv: key for %s: %v", hosts[0], err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: hosts[0], Organization: []string{"outbox-relay tests"}},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(certValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatalf("testenv: certificate for %s: %v", hosts[0], err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatalf("testenv: key for %s: %v", hosts[0], err)
	}
	base := filepath.Join(ca.dir, fmt.Sprintf("%s-%d", filepath.Base(hosts[0]), tmpl.SerialNumber.Uint64()%1e6))
	certFile, keyFile = base+".pem", base+".key"
	writePEM(t, certFile, "CERTIFICATE", der)
	writePEM(t, keyFile, "EC PRIVATE KEY", keyDER)
	return certFile, keyFile
}

func serial(t testing.TB) *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatalf("testenv: certificate serial: %v", err)
	}
	return n
}

// writePEM writes one PEM block, readable by the owner only (RabbitMQ runs
// as the test's user).
func writePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	data := pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatalf("testenv: write %s: %v", path, err)
	}
}
