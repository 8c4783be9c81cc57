package agent

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/carve-net/carve/agent/membership"
	"github.com/carve-net/carve/internal/buildinfo"
)

// metrics are the agent's metrics but for the reconciles' (package
// kernel's) and the IPAM's, the firewall's and WireGuard's own.
type metrics struct {
	registrations    *prometheus.CounterVec
	lostIP           prometheus.Counter
	tlsFailures      prometheus.Counter
	reports          *prometheus.CounterVec
	mastersReachable prometheus.Gauge
	gossip           *prometheus.CounterVec
	gossipRefused    *prometheus.CounterVec
	masterRefused    *prometheus.CounterVec
	statesRefused    *prometheus.CounterVec
	meshRefused      prometheus.Counter
	gossipPeers      prometheus.Gauge
	staleStates      prometheus.Counter
	rebuilds         prometheus.Counter
	restores         prometheus.Counter
	httpRefused      *prometheus.CounterVec
	masterReads      *prometheus.CounterVec
	gossipSent       *prometheus.CounterVec
	antiEntropy      *prometheus.CounterVec
	meshTargets      prometheus.Gauge
	// signingKeyFollowed counts new signing keys taken through the
	// masters' chain (rotations).
	signingKeyFollowed prometheus.Counter
	// refusing is 1 while the agent refuses the masters' records and
	// keeps its kernel as it is (verify.go, setRefusing).
	refusing prometheus.Gauge
}

func newMetrics(reg *prometheus.Registry) *metrics {
	m := &metrics{
		refusing: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "carve_agent_refusing_masters",
			Help: "1 while the agent refuses what the masters serve (a signing key it does not follow, records or saved records that do not verify) and keeps its kernel as it is; 0 once it holds a verified state.",
		}),
		masterReads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_agent_master_reads_total",
			Help: "Answers of the masters' watch, by kind: state (the whole state: the first read, or after gone), changes (only what changed), gone (410: the changes since the agent's index are not kept; a whole state read follows).",
		}, []string{"kind"}),
		registrations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_agent_registrations_total", Help: "Registration attempts, by result.",
		}, []string{"result"}),
		lostIP: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "carve_agent_lost_ip_registrations_total", Help: "Registrations again because the masters' record of this agent had lost its underlay IP to another registration.",
		}),
		tlsFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "carve_agent_tls_handshake_failures_total", Help: "Connections to the agent's HTTP API whose TLS handshake failed: logged at most once per 10s, counted every time.",
		}),
		reports: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_agent_reports_total", Help: "Configuration results sent to the masters (PUT /overlay-master/agents/{id}/report), by result.",
		}, []string{"result"}),
		mastersReachable: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "carve_agent_masters_reachable", Help: "1 when the last state watch succeeded.",
		}),
		gossip: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_agent_gossip_messages_total", Help: "Membership gossip messages received, by result: news (something merged), known (nothing new), refused (every record and tombstone in it refused: see carve_agent_gossip_refused_total), bad (undecodable).",
		}, []string{"result"}),
		gossipRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_agent_gossip_refused_total",
			Help: "Records and tombstones received by gossip and refused, by reason: unsigned; bad_signature (does not verify with the masters' key and this agent's cluster id: forged or altered); " +
				"out_of_range (signed, but outside the configured overlays or vtep_subnet, or a VTEP MAC not derived from the VTEP IP); other_cluster (of another cluster of masters, or heard before this agent read its first master state).",
		}, []string{"reason"}),
		masterRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_agent_master_records_refused_total",
			Help: "Records and tombstones of the masters' state refused, by reason (unsigned, bad_signature, out_of_range): a masters' bug or misconfiguration.",
		}, []string{"reason"}),
		statesRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_agent_master_states_refused_total",
			Help: "Master states refused whole, by reason: signing_key (signed with another key than the trusted one, pinned or --signing-pub-file's, and no chain of the masters' leads to it), unsigned (the masters sign nothing, and TLS or a key requires it).",
		}, []string{"reason"}),
		meshRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "carve_agent_mesh_handshakes_refused_total",
			Help: "Mesh connections refused because the peer's password differs (or one side has none): no gossip crosses them.",
		}),
		gossipPeers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "carve_agent_gossip_peers", Help: "Peers the mesh router knows.",
		}),
		staleStates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "carve_agent_stale_master_states_total", Help: "Master states ignored because they were behind what the agent had seen (same cluster, lower index).",
		}),
		signingKeyFollowed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "carve_agent_signing_keys_followed_total", Help: "New record-signing keys of the masters taken through their signing key chain (a rotation), with no restart.",
		}),
		rebuilds: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "carve_agent_cluster_rebuilds_total", Help: "Rebuilds of the masters' cluster seen (a new cluster id): the membership was reset.",
		}),
		restores: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "carve_agent_master_restores_total", Help: "Restores of the masters' table from a snapshot seen (a higher restore epoch): the membership was reset.",
		}),
		httpRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_agent_http_refused_total", Help: "Requests to the agent's HTTP API refused, by reason (no_certificate: no verified client certificate of the cluster CA).",
		}, []string{"reason"}),
	}
	m.gossipSent = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "carve_agent_gossip_sent_bytes_total",
		Help: "Bytes of gossip sent, by channel and kind: delta (changed records or rings, broadcast and relayed), digest (periodic anti-entropy), buckets, push (anti-entropy answers, unicast).",
	}, []string{"channel", "kind"})
	m.antiEntropy = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "carve_agent_gossip_antientropy_received_total",
		Help: "Membership anti-entropy messages received, by kind: digest, buckets, push (naming buckets); other_cluster (of another cluster, not answered); legacy (of the protocol before, from an agent not upgraded yet: ignored).",
	}, []string{"kind"})
	m.meshTargets = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "carve_agent_mesh_targets", Help: "Peers the agent keeps mesh connections to (bounded by --mesh-peers).",
	})
	for _, k := range []string{"delta", "digest", "buckets", "push"} {
		m.gossipSent.WithLabelValues("carve-agents", k)
	}
	for _, k := range []string{membership.EventDigest, membership.EventBuckets, membership.EventPush, membership.EventOtherCluster, membership.EventLegacy} {
		m.antiEntropy.WithLabelValues(k)
	}
	for _, r := range []string{"ok", "error"} {
		m.registrations.WithLabelValues(r)
		m.reports.WithLabelValues(r)
	}
	for _, r := range []string{"news", "known", "refused", "bad"} {
		m.gossip.WithLabelValues(r)
	}
	for _, r := range []string{membership.RefusedUnsigned, membership.RefusedBadSignature, membership.RefusedOutOfRange, membership.RefusedOtherCluster, membership.RefusedRevoked} {
		m.gossipRefused.WithLabelValues(r)
		if r != membership.RefusedOtherCluster {
			m.masterRefused.WithLabelValues(r)
		}
	}
	for _, r := range []string{stateRefusedKey, stateRefusedUnsigned} {
		m.statesRefused.WithLabelValues(r)
	}
	m.httpRefused.WithLabelValues("no_certificate")
	for _, k := range []string{"state", "changes", "gone"} {
		m.masterReads.WithLabelValues(k)
	}
	reg.MustRegister(m.registrations, m.lostIP, m.tlsFailures, m.reports,
		m.mastersReachable, m.gossip, m.gossipRefused, m.masterRefused, m.statesRefused, m.meshRefused, m.gossipPeers, m.staleStates, m.rebuilds, m.restores, m.httpRefused, m.masterReads,
		m.gossipSent, m.antiEntropy, m.meshTargets, m.signingKeyFollowed, m.refusing, buildinfo.Collector(buildinfo.Get()),
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}
