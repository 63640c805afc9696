package relay

import (
	"context"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/canal"
)

// watchSettings re-reads the server's global binlog settings
// (canal.ReadSettings: one statement) at the term's start and then every
// Config.HeartbeatInterval in which outbox rows were read (an idle relay
// sends nothing but its heartbeat), and says at once, at WARN and in the
// mode's reason (status), when one changed under it: a DBA's SET GLOBAL
// binlog_format='MIXED' after the start-up check passed reaches every
// producer session opened from then on. In auto mode a setting binlog mode
// cannot work with ends the binlog term: polling goes on (the probe returns
// to the binlog once the settings are right). In binlog mode the term goes
// on: the stream itself stops on the first outbox write it cannot read
// (canal.StatementError), naming it. It returns when stop closes or ctx
// ends; nil readSettings (unit tests): at once.
func (p *pipeline) watchSettings(ctx context.Context, stop <-chan struct{}) {
	r := p.r
	if r.readSettings == nil {
		return
	}
	t := time.NewTicker(r.cfg.HeartbeatInterval)
	defer t.Stop()
	var (
		last     canal.Settings
		haveLast bool // a read succeeded: last is what the server had
	)
	var rows int64 = -1 // outbox rows read at the last look; -1: look now
	for {
		if n := p.rowsRead.Load(); n != rows {
			rows = n
			s, err := r.readSettings(ctx)
			switch {
			case err != nil:
				r.log.Debug("binlog settings not read", zap.Error(err))
			case !haveLast && len(s.Problems()) == 0:
				last, haveLast = s, true // as the start-up check saw them
			case !haveLast || s != last:
				last, haveLast = s, true
				if p.settingsChanged(ctx, s) {
					return
				}
			}
		}
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// settingsChanged says that the settings are now s; true when it ended the
// binlog term.
func (p *pipeline) settingsChanged(ctx context.Context, s canal.Settings) (ended bool) {
	r := p.r
	problems := s.Problems()
	if len(problems) == 0 {
		r.log.Info("the server's binlog settings are right again", zap.Stringer("settings", s))
		p.recordReason(ctx, "mode binlog: the server's binlog settings are right again ("+s.String()+")")
		return false
	}
	said := make([]string, len(problems))
	for i, pe := range problems {
		said[i] = pe.Error()
	}
	what := "the server's binlog settings changed while the relay runs: " + strings.Join(said, "; ")
	if r.cfg.Mode == ModeAuto {
		r.log.Warn(what+"; binlog mode stops and polling delivers until they are right again",
			zap.Stringer("settings", s))
		p.watch.stop(what)
		return true
	}
	r.log.Warn(what+"; producer sessions opened from now on may write outbox rows the binlog cannot carry, "+
		"which stops binlog mode with status FAILED: set them back now", zap.Stringer("settings", s))
	p.recordReason(ctx, "mode binlog: WARNING: "+what)
	return false
}

// recordReason records why in the progress row's mode_reason (status),
// best effort: the acknowledgements go on whatever.
func (p *pipeline) recordReason(ctx context.Context, why string) {
	if err := p.store.SetMode(ctx, p.epoch, "", why); err != nil && ctx.Err() == nil {
		p.r.log.Debug("mode reason not recorded", zap.Error(err))
	}
}
