package fleet

import (
	"cmp"
	"context"
	"net/netip"
	"slices"
	"time"
)

// watchDNS resolves w's name now and then every Interval until ctx is done.
func (f *Fleet) watchDNS(ctx context.Context, w *dnsWatcher) {
	t := time.NewTicker(w.spec.Interval)
	defer t.Stop()
	for {
		f.resolve(ctx, w)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// resolve looks w's name up once and publishes the resulting membership. On
// failure the last known set stays.
func (f *Fleet) resolve(ctx context.Context, w *dnsWatcher) {
	rctx, cancel := context.WithTimeout(ctx, min(w.spec.Interval, maxDNSTimeout))
	defer cancel()
	addrs, err := f.cfg.Resolver.LookupHost(rctx, w.spec.Name)
	if ctx.Err() != nil {
		return
	}
	log := f.log.With("dns", w.spec.Name)
	if err != nil {
		w.fail.Add(1)
		log.Warn("fleet: dns resolution failed; keeping the last known replicas", "err", err)
		return
	}
	w.ok.Add(1)
	specs := make([]ReplicaSpec, 0, len(addrs))
	for _, a := range addrs {
		ip, err := netip.ParseAddr(a)
		if err != nil || ip.Zone() != "" {
			log.Warn("fleet: dns answer is not a routable IP address; skipped", "addr", a)
			continue
		}
		specs = append(specs, w.spec.specFor(ip.Unmap().String()))
	}
	slices.SortFunc(specs, func(a, b ReplicaSpec) int { return cmp.Compare(a.Name, b.Name) })
	specs = slices.CompactFunc(specs, func(a, b ReplicaSpec) bool { return a.Name == b.Name })
	f.setDNS(w.idx, specs)
}
