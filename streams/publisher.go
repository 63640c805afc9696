package streams

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"

	"github.com/outbox-relay/outbox-relay/internal/redact"
)

// openProducer opens the client's producer on a stream
// ((*stream.Environment).NewProducer; a fake in unit tests).
type openProducer func(streamName string, opts *stream.ProducerOptions) (clientProducer, error)

// rpcTimeout bounds each request to the broker (the client's own timeout).
const rpcTimeout = 10 * time.Second

// ErrPublisherClosed is returned by calls on a closed Publisher.
var ErrPublisherClosed = errors.New("stream publisher closed")

// querier is the broker's query of a producer's last publishing id
// (*stream.Environment).
type querier interface {
	QuerySequence(publisherReference, streamName string) (int64, error)
}

// Publisher is one connection to the broker's stream protocol (a
// stream.Environment) and the producers opened on it. No broker call runs
// under mu, the lock ConfirmWait (/readyz) and Close take: the calls run
// with the opening slot taken, each bounded by the caller's context (call).
type Publisher struct {
	cfg    Config
	env    *stream.Environment // nil in unit tests
	query  querier
	open   openProducer
	issued *Issued // this process's highest ids per producer name (may be nil)
	epoch  int64   // the relay epoch of the term: fresh ids start at EpochBase
	node   string  // host:port of the URL connected to ("": the first URL's)

	// opening (its one slot taken) serialises opening producers and
	// numbering them; a channel so that waiting for it ends with the
	// caller's context.
	opening chan struct{}

	mu        sync.Mutex
	producers map[string]*Producer // by producer name
	retired   []*Producer          // failed producers replaced, closing (startClose); Close waits for them
	closed    bool

	calls     sync.WaitGroup // broker calls under way (call); Close waits for them, boundedly
	callsWait time.Duration  // how long Close waits for them (closeWait)
}

// Dial connects to cfg.URL for a caller that numbers nothing freshly (the
// topology step, tests): DialTerm without a record of issued ids, epoch 0.
func Dial(cfg Config) (*Publisher, error) { return DialTerm(cfg, nil, 0) }

// DialTerm connects to cfg.URL (Environment) for a leader term of epoch:
// fresh ids (Router, StartFresh) start above FreshAfter, and every id sent
// is noted in issued.
func DialTerm(cfg Config, issued *Issued, epoch int64) (*Publisher, error) {
	env, node, err := environment(cfg)
	if err != nil {
		return nil, err
	}
	p := newPublisher(cfg, env, env, issued, epoch)
	p.node = node
	return p, nil
}

// Environment is the client's connection to cfg.URL as the relay dials it:
// with PasswordFile's password and the TLS of rabbitmq-stream+tls://. With
// one URL every connection goes to its address, in place of the one the
// broker advertises (a single node, or a load balancer in front of the
// cluster: the stream protocol would otherwise connect producers to the
// node name the broker advertises, which need not resolve from here). With
// several (a cluster's nodes) the first that accepts a connection is the
// locator, and producers connect to their stream's leader as the broker
// advertises it. The caller closes it. Code that reads or writes the
// streams beside the relay (bench) dials with it.
func Environment(cfg Config) (*stream.Environment, error) {
	env, _, err := environment(cfg)
	return env, err
}

// environment is Environment, and the host:port of the URL it connected to.
func environment(cfg Config) (*stream.Environment, string, error) {
	uris, err := cfg.dialURLs()
	if err != nil {
		return nil, "", err
	}
	opts := stream.NewEnvironmentOptions().SetRPCTimeout(rpcTimeout)
	tc, external, err := cfg.tlsConfig()
	if err != nil {
		return nil, "", err
	}
	if tc != nil {
		opts.SetTLSConfig(tc)
		if external {
			opts.SetSaslConfiguration(stream.SaslConfigurationExternal)
		}
	}
	connectErr := func(err error) error {
		return fmt.Errorf("connect to the stream protocol at %s (is the rabbitmq_stream plugin enabled? rabbitmq-plugins enable rabbitmq_stream): %w",
			redact.URL(cfg.URL), scrubbedAll(err, uris))
	}
	// The first that answers leads, so that the node reported is the one
	// connected to. With several the probe starts at a node drawn at
	// random: a node can accept connections and still answer "stream not
	// available" for minutes (seen on 3.10.8 after a SIGKILL and restart),
	// and a term that fails on it then tries another at the next term.
	start := 0
	if len(uris) > 1 {
		start = rand.IntN(len(uris))
	}
	first, err := firstReachable(uris, start, tc, probeTimeout)
	if err != nil {
		return nil, "", connectErr(err)
	}
	if len(uris) == 1 {
		opts.SetUri(uris[0])
		if u, err := url.Parse(uris[0]); err == nil && u.Hostname() != "" {
			port := u.Port()
			if port == "" {
				port = fmt.Sprint(DefaultPort)
			}
			var p int
			_, _ = fmt.Sscan(port, &p)
			opts.SetAddressResolver(stream.AddressResolver{Host: u.Hostname(), Port: p})
		}
	} else {
		// The client tries its URIs in order.
		opts.SetUris(append(append([]string(nil), uris[first:]...), uris[:first]...))
	}
	env, err := stream.NewEnvironment(opts)
	if err != nil {
		return nil, "", connectErr(err)
	}
	node := ""
	if u, err := url.Parse(uris[first]); err == nil {
		node = u.Host
	}
	return env, node, nil
}

// scrubbedAll is err with the passwords of uris masked.
func scrubbedAll(err error, uris []string) error {
	for _, u := range uris {
		err = scrubbed(err, u)
	}
	return err
}

// scrubbed is err with the password of uri masked (the client's messages
// may quote what it was given).
func scrubbed(err error, uri string) error {
	u, perr := url.Parse(uri)
	if perr != nil {
		return errors.New(redact.Scrub(err.Error(), []string{uri}))
	}
	if pw, ok := u.User.Password(); ok {
		return errors.New(redact.Scrub(err.Error(), []string{pw}))
	}
	return err
}

func newPublisher(cfg Config, q querier, env *stream.Environment, issued *Issued, epoch int64) *Publisher {
	p := &Publisher{cfg: cfg, env: env, query: q, issued: issued, epoch: epoch, producers: map[string]*Producer{},
		opening: make(chan struct{}, 1), callsWait: closeWait}
	if env != nil {
		p.open = func(streamName string, opts *stream.ProducerOptions) (clientProducer, error) {
			return env.NewProducer(streamName, opts)
		}
	}
	return p
}

// lockOpen takes the opening slot, or returns ctx's error (what: the
// caller's action) when ctx ends first.
func (p *Publisher) lockOpen(ctx context.Context, what string) error {
	select {
	case p.opening <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s: wait for another producer's opening: %w", what, ctx.Err())
	}
}

func (p *Publisher) unlockOpen() { <-p.opening }

// Config is the destination the publisher was dialed with.
func (p *Publisher) Config() Config { return p.cfg }

// call runs f, a broker call without a context of its own (bounded by the
// client's RPC timeout), and returns its error, or ctx's when ctx ends
// first. The goroutine is the Publisher's: Close waits for it, but only
// for a while (callsWait): the client's calls are bounded by its RPC
// timeout only once connected, and its reconnection of the locator
// connection retries without end while the broker is unreachable.
func (p *Publisher) call(ctx context.Context, what string, f func() error) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return fmt.Errorf("%s: %w", what, ErrPublisherClosed)
	}
	p.calls.Add(1)
	p.mu.Unlock()
	done := make(chan error, 1)
	go func() {
		defer p.calls.Done()
		done <- f()
	}()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s: %w", what, ctx.Err())
	}
}

// lastID is the broker's last publishing id of producer name on stream
// (0 when it never stored one).
func (p *Publisher) lastID(ctx context.Context, name, streamName string) (uint64, error) {
	var seq int64
	err := p.call(ctx, fmt.Sprintf("query the last publishing id of producer %s on stream %s", name, streamName), func() error {
		var err error
		seq, err = p.query.QuerySequence(name, streamName)
		return err
	})
	if err != nil || seq <= 0 {
		return 0, err
	}
	return uint64(seq), nil
}

// LastID is the broker's last publishing id of producer name on
// partition i (0 when it never stored one).
func (p *Publisher) LastID(ctx context.Context, name string, i int) (uint64, error) {
	return p.lastID(ctx, name, p.cfg.PartitionName(i))
}

// LastIDs returns, for each partition, the highest publishing id the broker
// stored for the producer "<prefix>-<i>" (0 when it never stored one).
func (p *Publisher) LastIDs(ctx context.Context, prefix string) ([]uint64, error) {
	ids := make([]uint64, p.cfg.Partitions)
	for i := range ids {
		last, err := p.lastID(ctx, prefix+"-"+strconv.Itoa(i), p.cfg.PartitionName(i))
		if err != nil {
			return nil, err
		}
		ids[i] = last
	}
	return ids, nil
}

// Producer returns the producer "<prefix>-<i>" on partition i, opening it
// on first use (one per name and Publisher: two producers of one name must
// not publish at once).
func (p *Publisher) Producer(ctx context.Context, prefix string, i int) (*Producer, error) {
	return p.ProducerNamed(ctx, prefix+"-"+strconv.Itoa(i), i)
}

// ProducerNamed is Producer for the producer name on partition i.
func (p *Publisher) ProducerNamed(ctx context.Context, name string, i int) (*Producer, error) {
	if err := p.lockOpen(ctx, "open producer "+name); err != nil {
		return nil, err
	}
	defer p.unlockOpen()
	return p.producerOpen(ctx, name, i)
}

// StartFresh makes producer name on partition i number the messages it
// numbers itself (m.Seq 0) freshly: above FreshAfter of the broker's last
// id, this process's issued ids and the epoch, before anything is sent
// through it; once per producer and Publisher. It returns the producer.
func (p *Publisher) StartFresh(ctx context.Context, name string, i int) (*Producer, error) {
	if err := p.lockOpen(ctx, "open producer "+name); err != nil {
		return nil, err
	}
	defer p.unlockOpen()
	pr, err := p.producerOpen(ctx, name, i)
	if err != nil || pr.fresh {
		return pr, err
	}
	last, err := p.lastID(ctx, pr.name, pr.stream)
	if err != nil {
		return nil, err
	}
	pr.StartAbove(FreshAfter(last, p.issued.Last(pr.name), p.epoch))
	pr.fresh = true
	return pr, nil
}

// producerOpen is ProducerNamed with the opening slot taken.
func (p *Publisher) producerOpen(ctx context.Context, name string, i int) (*Producer, error) {
	p.mu.Lock()
	pr, ok := p.producers[name]
	p.mu.Unlock()
	if ok && pr.Err() == nil {
		return pr, nil
	}
	var after uint64 // a failed producer's last id: its successor numbers above it
	if ok {
		// Failed (a message not confirmed, its connection lost): replaced,
		// so that a caller that goes on (the due-time sweep) is not stuck
		// with it.
		// Its close runs on (startClose): the client's close takes
		// seconds, and may never return, and the opening slot is held
		// here. Close waits for it, boundedly.
		after = pr.Last()
		pr.startClose()
		p.mu.Lock()
		delete(p.producers, name)
		p.retireLocked(pr)
		p.mu.Unlock()
	}
	opts := p.cfg.producerOptions(name)
	var sp clientProducer
	hint := "declare the partition streams: run with --stream-declare"
	if len(p.cfg.URLs()) > 1 {
		hint += "; the producer connects to the stream's leader as its node advertises itself (stream.advertised_host and advertised_port), which must be reachable from here"
	}
	err := p.call(ctx, fmt.Sprintf("open producer %s on stream %s (%s)", name, p.cfg.PartitionName(i), hint),
		func() error {
			var err error
			sp, err = p.open(p.cfg.PartitionName(i), opts)
			if err != nil {
				return err
			}
			p.mu.Lock()
			closed := p.closed
			p.mu.Unlock()
			if closed || ctx.Err() != nil { // nobody will use it: never leave it open
				_ = sp.Close()
				if closed {
					return ErrPublisherClosed
				}
				return ctx.Err()
			}
			return nil
		})
	if err != nil {
		return nil, err
	}
	pr = newProducer(sp, name, p.cfg.PartitionName(i), p.cfg.Window, p.issued)
	pr.StartAbove(after)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		// Close has listed the producers already, and its env.Close may be
		// under way: closing this one here too could run the client's
		// close of it twice at once (a panic); env.Close closes it.
		return nil, fmt.Errorf("open producer %s: %w", name, ErrPublisherClosed)
	}
	p.producers[name] = pr
	return pr, nil
}

// retireLocked keeps pr, a replaced producer closing, for Close to wait
// for; those closed already are forgotten. p.mu is held.
func (p *Publisher) retireLocked(pr *Producer) {
	kept := p.retired[:0]
	for _, r := range p.retired {
		select {
		case <-r.clientClosed:
			select {
			case <-r.done:
				continue
			default:
			}
		default:
		}
		kept = append(kept, r)
	}
	p.retired = append(kept, pr)
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

// Node is the host:port of the URL the publisher connected to (never
// credentials): with several URLs, the one that answered first.
func (p *Publisher) Node() string {
	if p.node != "" {
		return p.node
	}
	u, err := url.Parse(p.cfg.URLs()[0])
	if err != nil {
		return ""
	}
	return u.Host
}

// ConfirmWait is how long the oldest unconfirmed message of any producer
// has waited (0 when none is unconfirmed).
func (p *Publisher) ConfirmWait() time.Duration {
	var wait time.Duration
	for _, pr := range p.list() {
		wait = max(wait, pr.ConfirmWait())
	}
	return wait
}

// list is the open producers.
func (p *Publisher) list() []*Producer {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*Producer, 0, len(p.producers))
	for _, pr := range p.producers {
		out = append(out, pr)
	}
	return out
}

// Close closes the producers (those replaced included) and the
// connection, and waits for the broker calls under way (the closed
// connection ends them) and the producers' confirmation goroutines, all at
// once and under one deadline (callsWait, closeWait): the client's
// producer close takes seconds each (and a delete request bounded by the
// RPC timeout), and may never return (a batch writer blocked on a stalled
// socket holds the lock it needs), and a call stuck in the client's
// reconnection loop (which retries while the broker is unreachable,
// without checking that the connection was closed) must not hold a
// SIGTERM or a pause beyond the shutdown timeout. What is still running at
// the deadline is named in the error and left behind (leaked) until the
// client returns: the client offers no way to abort it; its result goes
// nowhere (the channels are buffered).
func (p *Publisher) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	prs := append(make([]*Producer, 0, len(p.producers)+len(p.retired)), p.retired...)
	for _, pr := range p.producers {
		prs = append(prs, pr)
	}
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), p.callsWait)
	defer cancel()
	for _, pr := range prs {
		pr.startClose()
	}
	waited := make(chan struct{})
	go func() { // ends when the calls do; Close does not wait for it beyond the deadline
		p.calls.Wait()
		close(waited)
	}()
	envClosed := make(chan error, 1)
	if p.env != nil {
		// Left behind when env.Close never returns (see above). It starts
		// once the producers' own closes have returned, or halfway to
		// the deadline: env.Close closes the producers still registered
		// too, and the client's close of one producer must not run twice
		// at once (its status check is not atomic: a second close sends
		// on a closed channel and panics); by then each has marked itself
		// closed, so env.Close's returns AlreadyClosed.
		// It waits for the broker calls too: a producer opening while
		// Close runs closes itself within its call when it finds the
		// publisher closed.
		go func() {
			half := make(chan struct{}) // closed halfway to the deadline
			timer := time.AfterFunc(p.callsWait/2, func() { close(half) })
			defer timer.Stop()
			select {
			case <-waited:
			case <-half:
			}
			for _, pr := range prs {
				select {
				case <-pr.clientClosed:
				case <-half:
				}
			}
			envClosed <- p.env.Close()
		}()
	}
	var errs []error
	for _, pr := range prs {
		errs = append(errs, pr.closeBy(ctx))
	}
	if p.env != nil {
		select {
		case err := <-envClosed:
			if err != nil {
				errs = append(errs, fmt.Errorf("close the stream connection: %w", err))
			}
		case <-ctx.Done():
			errs = append(errs, fmt.Errorf("close the stream connection: still closing after %v: left running", p.callsWait))
		}
	}
	select {
	case <-waited:
	case <-ctx.Done():
		errs = append(errs, fmt.Errorf("close the stream connection: broker calls still under way after %v (the broker unreachable?): left behind", p.callsWait))
	}
	return errors.Join(errs...)
}
