package main

import (
	"flag"

	"github.com/outbox-relay/outbox-relay/publish"
)

// defaultAMQPURL is --amqp-url's default: the local broker as guest.
const defaultAMQPURL = "amqp://guest:guest@127.0.0.1:5672/"

// declareAMQP declares --amqp-url with urlUsage (what the command does with
// it: one URL, or a list of a cluster's nodes) and the TLS and password-file
// flags that go with it, the same in every command that connects to
// RabbitMQ.
func declareAMQP(fs *flag.FlagSet, url *string, o *publish.ConnOptions, urlUsage string) {
	fs.StringVar(url, "amqp-url", defaultAMQPURL, urlUsage)
	fs.StringVar(&o.TLSCA, "amqp-tls-ca", "", "PEM `file` of the CA certificates that verify the broker's certificate (amqps://; default: the system's)")
	fs.StringVar(&o.TLSCert, "amqp-tls-cert", "", "PEM `file` of a client certificate for the broker, with --amqp-tls-key; without a password the login is EXTERNAL, as the user the broker takes from the certificate")
	fs.StringVar(&o.TLSKey, "amqp-tls-key", "", "PEM `file` of the unencrypted key of --amqp-tls-cert")
	fs.StringVar(&o.PasswordFile, "amqp-password-file", "", "`file` holding the password of the --amqp-url user (the URL then has none; trailing line breaks are ignored); read again at every connect, so a rotated password needs no restart")
}

// checkAMQP refuses, as bad usage, an --amqp-url the client cannot dial or
// TLS and password-file flags that cannot work with it (see
// publish.ConnOptions.Check); files are read once to report a missing one
// now.
func checkAMQP(url string, o publish.ConnOptions) error {
	if err := checkAMQPURL(url); err != nil {
		return err
	}
	if err := o.Check(url); err != nil {
		return usagef("%v", err)
	}
	return nil
}
