//! Whether a member is cut off, and its fence for as long as the agent runs: a primary
//! cut off from the control plane and from every other member for
//! [`super::ISOLATED_FENCE_AFTER`] fences itself (its node lost to the others, whose clients may
//! still reach it); a fenced member's fence command runs until it succeeds, and again
//! every [`REFENCE_EVERY`].

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{Agent, Fence, PORT, parse};

/// How often the agent looks whether its member is cut off.
pub(super) const LOOK_EVERY: Duration = Duration::from_secs(1);
/// How long a look waits for the control plane, for the cluster's DNS, and for a member
/// (the control plane and the members are looked at side by side: a look takes two).
pub(super) const LOOK_TIMEOUT: Duration = Duration::from_secs(1);
/// How often a fenced member's fence command is run again once it has succeeded (not
/// more often: a fence may cut the streams a switchover's member catches up by).
pub(super) const REFENCE_EVERY: Duration = Duration::from_secs(5);

/// The fence, for as long as the agent runs: while the member is not fenced, a look
/// every [`LOOK_EVERY`] whether it is cut off (it fences itself once cut off for
/// [`super::ISOLATED_FENCE_AFTER`] while it says it is primary); once fenced, the fence command
/// until it succeeds, and again every [`REFENCE_EVERY`] (an engine restarted in place
/// must not stay unfenced). A member that fenced itself, cut off, has no one to order
/// its engine stopped when the fence command fails (a hung engine, or a commit that
/// waits for a replica it no longer reaches): its agent orders its guard to stop it
/// then, so that it is fenced within [`super::FENCED_WITHIN`] all the same.
pub(super) async fn watch(agent: Arc<Agent>) {
    let Some(fence) = agent.commands.fence.as_ref() else { return };
    if fence.control_plane.is_none() {
        tracing::warn!("KUBERNETES_SERVICE_HOST is not set: this member never fences itself");
    }
    // The start of the last look that reached the control plane or another member.
    let (mut reached, mut fenced_at) = (tokio::time::Instant::now(), None::<tokio::time::Instant>);
    // The other members' addresses as the cluster's DNS last listed them.
    let (mut listed, mut was_cut_off) = (Vec::new(), false);
    let mut cut_off_fence = false;
    loop {
        let wait = if agent.is_fenced() {
            if agent.rerun.swap(false, Ordering::SeqCst) || fenced_at.is_none_or(|at| at.elapsed() >= REFENCE_EVERY) {
                match agent.run(&fence.argv).await {
                    Ok(_) => {
                        if fenced_at.is_none() {
                            tracing::warn!("fenced: the engine takes no more writes");
                        }
                        fenced_at = Some(tokio::time::Instant::now());
                        agent.fence_runs.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(e) if cut_off_fence && fenced_at.is_none() && !fence.stop.exists() => {
                        tracing::warn!("the fence command failed while cut off ({e}): the engine's guard stops it");
                        match std::fs::write(&fence.stop, "cut off, and its fence was not confirmed\n") {
                            Ok(()) => agent.rerun.store(true, Ordering::SeqCst),
                            Err(e) => tracing::warn!("cannot order the engine stopped: {e}"),
                        }
                    }
                    Err(e) => tracing::warn!("the fence command failed (tried again): {e}"),
                }
            }
            Duration::from_millis(200)
        } else {
            let look = tokio::time::Instant::now();
            let cut_off = match &fence.control_plane {
                Some(address) => {
                    let (control_plane, member) = tokio::join!(reachable(address), any_member_reachable(fence, &mut listed));
                    !control_plane && !member
                }
                None => false,
            };
            // Said when it starts and ends: what a fence of its own, or none, came from.
            match (cut_off, was_cut_off) {
                (true, false) => tracing::warn!("cut off: neither the control plane nor another member answers"),
                (false, true) => tracing::info!("reached again after {:.1} s cut off", reached.elapsed().as_secs_f64()),
                _ => {}
            }
            was_cut_off = cut_off;
            if !cut_off {
                reached = look;
            }
            if cut_off && reached.elapsed() >= fence.cut_off_after {
                let primary = agent.run(&agent.commands.status).await.ok().and_then(|said| parse(&said).ok()).is_some_and(|s| s.primary);
                if primary {
                    let why = format!("primary, and cut off from the control plane and every other member for {:?}", fence.cut_off_after);
                    match agent.mark_fenced(&why) {
                        Ok(()) => cut_off_fence = true,
                        Err(e) => tracing::warn!("cannot mark the member fenced: {e}"),
                    }
                    continue;
                }
            }
            LOOK_EVERY
        };
        let _ = tokio::time::timeout(wait, agent.fenced.notified()).await;
    }
}

/// The control plane's address, as Kubernetes gives every container.
pub fn control_plane() -> Option<String> {
    let host = std::env::var("KUBERNETES_SERVICE_HOST").ok().filter(|h| !h.is_empty())?;
    let port = std::env::var("KUBERNETES_SERVICE_PORT").ok().filter(|p| !p.is_empty()).unwrap_or_else(|| "443".into());
    Some(if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") })
}

/// Whether a TCP connection to `address` opens within [`LOOK_TIMEOUT`].
async fn reachable(address: &str) -> bool {
    matches!(tokio::time::timeout(LOOK_TIMEOUT, tokio::net::TcpStream::connect(address)).await, Ok(Ok(_)))
}

/// Whether another member's agent is reachable, at the addresses the cluster's DNS lists
/// now, or, when it does not answer (it lives with the control plane, and a busy one is
/// slow), at those it listed last (`known`, kept up to date): a member that never heard
/// of another counts none reachable. A member with no other (one member, or the only one
/// listed) is never cut off from them.
pub(super) async fn any_member_reachable(fence: &Fence, known: &mut Vec<std::net::SocketAddr>) -> bool {
    let listed = tokio::time::timeout(LOOK_TIMEOUT, tokio::net::lookup_host((fence.members.as_str(), PORT))).await;
    match listed {
        Ok(Ok(addresses)) => *known = addresses.filter(|a| Some(a.ip()) != fence.own).collect(),
        _ if known.is_empty() => return false,
        _ => {}
    }
    if known.is_empty() {
        return true;
    }
    let tries = known.iter().map(|a| tokio::time::timeout(LOOK_TIMEOUT, tokio::net::TcpStream::connect(*a)));
    futures::future::join_all(tries).await.iter().any(|r| matches!(r, Ok(Ok(_))))
}
