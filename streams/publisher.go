package streams

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"

	"github.com/outbox-relay/outbox-relay/internal/redact"
)

// rpcTimeout bounds each request to the broker (the client's own timeout).
const rpcTimeout = 10 * time.Second

// Publisher is one connection to the broker's stream protocol (a
// stream.Environment) and the producers opened on it.
type Publisher struct {
	cfg Config
	env *stream.Environment

	mu        sync.Mutex
	producers map[string]*Producer // by producer name
}

// Dial connects to cfg.URL. The broker's advertised host is replaced by
// the URL's own (a single node, or a load balancer in front of the
// cluster): the stream protocol would otherwise connect producers to the
// node name the broker advertises, which need not resolve from here.
func Dial(cfg Config) (*Publisher, error) {
	uri, err := cfg.dialURL()
	if err != nil {
		return nil, err
	}
	opts := stream.NewEnvironmentOptions().SetUri(uri).SetRPCTimeout(rpcTimeout)
	if u, err := url.Parse(cfg.URL); err == nil && u.Hostname() != "" {
		port := u.Port()
		if port == "" {
			port = fmt.Sprint(DefaultPort)
		}
		var p int
		_, _ = fmt.Sscan(port, &p)
		opts.SetAddressResolver(stream.AddressResolver{Host: u.Hostname(), Port: p})
	}
	env, err := stream.NewEnvironment(opts)
	if err != nil {
		return nil, fmt.Errorf("connect to the stream protocol at %s (is the rabbitmq_stream plugin enabled? rabbitmq-plugins enable rabbitmq_stream): %w",
			redact.URL(cfg.URL), err)
	}
	return &Publisher{cfg: cfg, env: env, producers: map[string]*Producer{}}, nil
}

// Config is the destination the publisher was dialed with.
func (p *Publisher) Config() Config { return p.cfg }

// LastIDs returns, for each partition, the highest publishing id the broker
// stored for the producer "<prefix>-<i>" (0 when it never stored one).
func (p *Publisher) LastIDs(prefix string) ([]uint64, error) {
	ids := make([]uint64, p.cfg.Partitions)
	for i := range ids {
		name := prefix + "-" + strconv.Itoa(i)
		seq, err := p.env.QuerySequence(name, p.cfg.PartitionName(i))
		if err != nil {
			return nil, fmt.Errorf("query the last publishing id of producer %s on stream %s: %w",
				name, p.cfg.PartitionName(i), err)
		}
		if seq > 0 {
			ids[i] = uint64(seq)
		}
	}
	return ids, nil
}

// Producer returns the producer "<prefix>-<i>" on partition i, opening it
// on first use (one per name and Publisher: two producers of one name must
// not publish at once).
func (p *Publisher) Producer(prefix string, i int) (*Producer, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.producerLocked(prefix, i)
}

// numbered is Producer for messages it numbers itself (a Router's): on
// first use the producer starts above the broker's last id for its name,
// before anything is sent through it.
func (p *Publisher) numbered(prefix string, i int) (*Producer, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pr, err := p.producerLocked(prefix, i)
	if err != nil || pr.aboveBroker {
		return pr, err
	}
	seq, err := p.env.QuerySequence(pr.name, pr.stream)
	if err != nil {
		return nil, fmt.Errorf("query the last publishing id of producer %s on stream %s: %w", pr.name, pr.stream, err)
	}
	if seq > 0 {
		pr.StartAbove(uint64(seq))
	}
	pr.aboveBroker = true
	return pr, nil
}

func (p *Publisher) producerLocked(prefix string, i int) (*Producer, error) {
	name := prefix + "-" + strconv.Itoa(i)
	if pr, ok := p.producers[name]; ok {
		return pr, nil
	}
	opts := stream.NewProducerOptions().SetProducerName(name).SetClientProvidedName(name)
	if p.cfg.ConfirmTimeout > 0 {
		opts.SetConfirmationTimeOut(p.cfg.ConfirmTimeout)
	}
	sp, err := p.env.NewProducer(p.cfg.PartitionName(i), opts)
	if err != nil {
		return nil, fmt.Errorf("open producer %s on stream %s (declare the partition streams: run with --stream-declare): %w",
			name, p.cfg.PartitionName(i), err)
	}
	pr := newProducer(sp, name, p.cfg.PartitionName(i), p.cfg.Window)
	p.producers[name] = pr
	return pr, nil
}

// Declare declares the partition streams that do not exist yet (those an
// operator declared, with their own retention, are used as they are) and
// then, where the broker and the client support it, the super stream over
// them; superStream reports whether it was declared (the client can do so
// on RabbitMQ 3.13+; on 3.11 and 3.12 `rabbitmq-streams add_super_stream`
// does it).
func (p *Publisher) Declare() (superStream bool, err error) {
	for i := 0; i < p.cfg.Partitions; i++ {
		name := p.cfg.PartitionName(i)
		if err := p.env.DeclareStream(name, nil); err != nil && !errors.Is(err, stream.StreamAlreadyExists) {
			return false, fmt.Errorf("declare stream %s: %w", name, err)
		}
	}
	err = p.env.DeclareSuperStream(p.cfg.Stream, stream.NewPartitionsOptions(p.cfg.Partitions))
	switch {
	case err == nil:
		return true, nil
	case strings.Contains(err.Error(), "not supported"):
		return false, nil
	}
	return false, fmt.Errorf("declare super stream %s: %w", p.cfg.Stream, err)
}

// Node is the host:port the publisher connects to (never credentials).
func (p *Publisher) Node() string {
	u, err := url.Parse(p.cfg.URL)
	if err != nil {
		return ""
	}
	return u.Host
}

// ConfirmWait is how long the oldest unconfirmed message of any producer
// has waited (0 when none is unconfirmed).
func (p *Publisher) ConfirmWait() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	var wait time.Duration
	for _, pr := range p.producers {
		wait = max(wait, pr.ConfirmWait())
	}
	return wait
}

// Close closes the producers and the connection.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for _, pr := range p.producers {
		errs = append(errs, pr.Close())
	}
	if err := p.env.Close(); err != nil {
		errs = append(errs, fmt.Errorf("close the stream connection: %w", err))
	}
	return errors.Join(errs...)
}
