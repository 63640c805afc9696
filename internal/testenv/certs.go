package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// certLifetime is how long the certificates made here are valid: from an
// hour ago (clock skew between the test and a server) for a day.
const certLifetime = 24 * time.Hour

// CA is a certificate authority made at test time (ECDSA P-256, crypto/x509):
// nothing is committed to the repository. Its certificate is written as PEM
// to CertFile; the certificates it issues go to the same directory, one of
// the test's temporary directories, removed at cleanup.
//
// A CA's methods are safe for concurrent use.
type CA struct {
	// CertFile is the CA certificate in PEM: what a server's ssl-ca or a
	// client's --mysql-tls-ca (--amqp-tls-ca) names.
	CertFile string
	// Cert is the parsed CA certificate.
	Cert *x509.Certificate

	dir string
	key *ecdsa.PrivateKey

	mu     sync.Mutex
	issued int // certificates issued, for unique file names
}

// Cert is a certificate and its private key issued by a CA, as PEM files and
// as a tls.Certificate.
type Cert struct {
	CertFile string // the certificate in PEM
	KeyFile  string // its private key in PEM (PKCS #8), mode 0600
	TLS      tls.Certificate
}

// NewCA makes a new certificate authority for the test. Two CAs never trust
// each other's certificates: a test of a wrong CA makes a second one.
func NewCA(t testing.TB) *CA {
	t.Helper()
	ca, err := newCA(t.TempDir())
	if err != nil {
		t.Fatalf("testenv: make a CA: %v", err)
	}
	return ca
}

func newCA(dir string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate the CA key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "outbox-relay test CA " + filepath.Base(dir)},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(certLifetime),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("sign the CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse the CA certificate: %w", err)
	}
	ca := &CA{CertFile: filepath.Join(dir, "ca.pem"), Cert: cert, dir: dir, key: key}
	if err := writePEM(ca.CertFile, "CERTIFICATE", der, 0o644); err != nil {
		return nil, err
	}
	return ca, nil
}

// Issue makes a certificate signed by the CA, valid for server and client
// authentication. Each host is an IP address (127.0.0.1) or a DNS name
// (localhost) the certificate is valid for; the first is also its common
// name. A client certificate needs no real host: Issue(t, "relay") gives
// one whose common name is "relay".
func (ca *CA) Issue(t testing.TB, hosts ...string) *Cert {
	t.Helper()
	c, err := ca.issue(hosts)
	if err != nil {
		t.Fatalf("testenv: issue a certificate for %v: %v", hosts, err)
	}
	return c
}

func (ca *CA) issue(hosts []string) (*Cert, error) {
	if len(hosts) == 0 {
		return nil, fmt.Errorf("no host or name given")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate a key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: hosts[0]},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(certLifetime),
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
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("sign: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encode the key: %w", err)
	}
	ca.mu.Lock()
	ca.issued++
	base := filepath.Join(ca.dir, fmt.Sprintf("%d-%s", ca.issued, fileSafe(hosts[0])))
	ca.mu.Unlock()
	c := &Cert{CertFile: base + ".pem", KeyFile: base + "-key.pem"}
	if err := writePEM(c.CertFile, "CERTIFICATE", der, 0o644); err != nil {
		return nil, err
	}
	if err := writePEM(c.KeyFile, "PRIVATE KEY", keyDER, 0o600); err != nil {
		return nil, err
	}
	if c.TLS, err = tls.X509KeyPair(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})); err != nil {
		return nil, fmt.Errorf("load the key pair: %w", err)
	}
	return c, nil
}

// Pool is a certificate pool holding only the CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// ClientTLS is a client configuration that trusts only this CA and checks
// the server's name against serverName (an IP address or a DNS name).
func (ca *CA) ClientTLS(serverName string) *tls.Config {
	return &tls.Config{RootCAs: ca.Pool(), ServerName: serverName, MinVersion: tls.VersionTLS12}
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		panic("testenv: crypto/rand failed: " + err.Error())
	}
	return n
}

func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), mode); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// fileSafe keeps letters, digits, dots and dashes of s for a file name.
func fileSafe(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-' {
			return r
		}
		return '_'
	}, s)
}

// IssueFiles is Issue for callers that need only the PEM files.
func (ca *CA) IssueFiles(t testing.TB, hosts ...string) (certFile, keyFile string) {
	t.Helper()
	c := ca.Issue(t, hosts...)
	return c.CertFile, c.KeyFile
}
