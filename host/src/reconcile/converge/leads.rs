//! Who leads, the stages of a pass that decide it: a failover of a lost primary, a
//! planned switchover, the leader an engine elects, and what the members' agents say.

use super::*;
use crate::reconcile;

impl Pass<'_> {
    /// The primary: the one in status, or the member the plugin chooses when it has been
    /// lost for longer than the failover delay.
    /// What the members' agents said, when asked, is kept with the members.
    pub(super) async fn failover(&mut self, plugin: &Plugin, spec: &EngineSpec, members: &mut Members) -> Result<Primary, Error> {
        let ctx = self.ctx;
        let primary = self.old.primary.clone().unwrap_or_else(|| Names(&self.name).pod(0));
        // A switchover under way: asked for, or for a drain of the primary's node.
        let draining = members.observed.iter().any(|m| m.name == primary && m.node.as_deref().is_some_and(|n| ctx.caches.cordoned(n)));
        let switching = draining || self.db.annotations().contains_key(crate::names::SWITCHOVER);
        let after = decide::failover_delay(&members.observed, &primary, switching, ctx.settings.failover_after);
        let elects = plugin.info().capabilities.elects_leader;
        let chosen = match decide::failover_question(&members.observed, &primary, after, elects, plugin.lacks(Capability::Failover)) {
            FailoverQuestion::Keep => self.switchover(&primary, members, elects).await?,
            FailoverQuestion::Refuse(note) => Primary { notes: vec![note], ..Primary::keep(&primary) },
            FailoverQuestion::Ask(candidates) => {
                let said = reconcile::agent::statuses(ctx, self.db, &members.observed).await?;
                members.heard = reconcile::agent::by_pod(&members.observed, &said);
                match decide::answering_though_down(&members.observed, &primary, &said) {
                    Some(kept) => kept,
                    None => self.replace(plugin, spec, members, (&primary, after), candidates, said).await?,
                }
            }
        };
        self.say(&chosen.notes);
        for note in &chosen.notes {
            let how = match note.reason {
                Reason::FailoverPromoted => "failover",
                Reason::SwitchoverPromoted => "switchover",
                _ => continue,
            };
            self.ctx.metrics.promoted(self.db, how);
        }
        if chosen.failed_over {
            self.plan.promoted(chosen.name.clone());
        }
        Ok(chosen)
    }

    /// The primary the plugin chooses among `candidates` (with what their agents `said`)
    /// for `primary`, lost for the failover delay `after`: the old one fenced where its
    /// agent answers, the new one promoted in place where its agent can. Under synchronous
    /// replication the plugin is not asked while the replicas the old primary last had
    /// confirm its commits are silent ([`decide::named_replicas_wait`]).
    async fn replace(
        &mut self,
        plugin: &Plugin,
        spec: &EngineSpec,
        members: &Members,
        (primary, after): (&str, std::time::Duration),
        candidates: Vec<crate::plugin::Member>,
        said: Vec<Option<crate::agent::Status>>,
    ) -> Result<Primary, Error> {
        let ctx = self.ctx;
        let old = members.observed.iter().find(|m| m.name == primary);
        let candidates = members::with_positions(candidates, &members.observed, said);
        let named = old.and_then(|m| m.last_told.as_ref()).map(|(key, _)| key.as_str());
        let answer = match decide::named_replicas_wait(named, spec.synchronous_replicas, &candidates) {
            Some(why) => Ok(crate::plugin::FailoverDecision::NoSafeMember(why)),
            None => match ctx.ask::<ChoosePrimary>(plugin, (spec.clone(), candidates)).await {
                Err(Error::Plugin(e)) => Err(e.to_string()),
                asked => Ok(asked?),
            },
        };
        // The old primary takes no more writes before another is promoted: fenced, or, when
        // its engine does not confirm the fence (hung), stopped.
        let fenced = match &answer {
            Ok(crate::plugin::FailoverDecision::Promote { .. }) => match reconcile::agent::fence(ctx, self.db, old).await? {
                reconcile::decide::Fenced::Ordered => reconcile::agent::stop(ctx, self.db, old).await?,
                fenced => fenced,
            },
            _ => reconcile::decide::Fenced::Unknown,
        };
        let mut chosen = decide::failover(primary, after, old.and_then(|m| m.down.as_deref()), answer, fenced);
        if chosen.failed_over {
            reconcile::agent::promote(ctx, self.db, members.observed.iter().find(|m| m.name == chosen.name), primary).await?;
            let followed = reconcile::agent::follow(ctx, self.db, &members.observed, &chosen.name, primary).await?;
            decide::told_to_follow(&mut chosen.notes, followed);
        }
        Ok(chosen)
    }

    /// What each member's agent says of it (its position, and a replica's lag), for the
    /// status: asked once every `member_poll`, unless the failover stage asked this pass.
    /// A member that says it takes writes while `primary` leads is fenced at once (an
    /// engine that elects its leader has none such: its members say who leads); says
    /// whether one was. Asked in every pass whose roll would restart a replica to follow
    /// while a member is away: not one that streams.
    pub(super) async fn hear(&mut self, agent: bool, members: &mut Members, primary: &str, elects: bool) -> Result<bool, Error> {
        let follow = reconcile::members::to_follow_while_away(&members.observed, primary);
        let due = self.ctx.agents.due(self.db, if follow { std::time::Duration::ZERO } else { self.ctx.settings.member_poll });
        if !agent || !members.heard.is_empty() || members.observed.is_empty() || !due {
            return Ok(false);
        }
        let said = reconcile::agent::statuses(self.ctx, self.db, &members.observed).await?;
        members.heard = reconcile::agent::by_pod(&members.observed, &said);
        let second = if elects { Vec::new() } else { decide::second_primaries(&members.observed, primary, &said) };
        for (member, note) in &second {
            reconcile::agent::fence(self.ctx, self.db, Some(member)).await?;
            self.say(std::slice::from_ref(note));
        }
        Ok(!second.is_empty())
    }

    /// Says when members that should run their agent (`wanted`) run none (`given`): the
    /// operator, without its image, fails nothing over, fences nothing and refuses every
    /// switchover (a Warning, once).
    pub(super) fn agents(&mut self, wanted: bool, given: bool) {
        if wanted && !given {
            self.say(&[decide::no_agents()]);
        } else {
            self.plan.told.remove(ConditionType::MemberAgents);
        }
    }

    /// A planned switchover, when the Database's annotation asks for one (see
    /// [`super::switchover`]).
    async fn switchover(&mut self, primary: &str, members: &mut Members, elects: bool) -> Result<Primary, Error> {
        let (chosen, heard) = reconcile::switchover::carry_out(self.ctx, self.db, primary, &members.observed, elects).await?;
        members.heard = heard.unwrap_or_default();
        Ok(chosen)
    }

    /// An engine that elects its leader: every member is asked the workload's member
    /// query and the plugin names the leader from the answers; the read-write Service
    /// follows it. Nobody answering (members starting, or all down) keeps the last one.
    pub(super) async fn elected(
        &mut self,
        plugin: &Plugin,
        spec: &EngineSpec,
        members: &Members,
        workload: &Workload,
        primary: Primary,
    ) -> Result<Primary, Error> {
        let ctx = self.ctx;
        // Host policy lets a workload carry a member query only with `elects-leader`.
        let Some(query) = workload.member_query.as_ref() else { return Ok(primary) };
        let ca = match (query.https, spec.tls.is_some()) {
            (false, _) => None,
            (true, true) => Some(self.authority_certificate().await?),
            // Host policy refuses a member query over HTTPS without TLS.
            (true, false) => return Ok(primary),
        };
        let domain = format!("{}.{}.svc", Names(&self.name).headless(), self.ns);
        let transport = match &ca {
            Some(ca) => reconcile::ask::Transport::Tls { ca, domain: &domain, identity: None },
            None => reconcile::ask::Transport::Plain(&ctx.members_client),
        };
        let answers = reconcile::ask::answers(transport, query, &members.observed).await;
        let mut candidates = members::for_plugin(&members.observed, &primary.name);
        for (member, answer) in candidates.iter_mut().zip(answers) {
            member.answer = answer;
        }
        if candidates.iter().all(|m| m.answer.is_none()) {
            return Ok(primary);
        }
        let answer = match ctx.ask::<ChoosePrimary>(plugin, (spec.clone(), candidates)).await {
            Err(Error::Plugin(e)) => Err(e.to_string()),
            asked => Ok(asked?),
        };
        let leader = decide::elected(&primary.name, &plugin.id(), answer);
        self.say(&leader.notes);
        Ok(leader)
    }

    /// The certificate of the Database's authority (PEM), from its TLS Secret (cert-manager's
    /// or plugdb's), read again only when the Secret changed; empty until it is there.
    async fn authority_certificate(&self) -> Result<std::sync::Arc<[u8]>, Error> {
        let tls = Names(&self.name).tls();
        Ok(reconcile::agent::certificate_authority(self.ctx, self.db, &tls, false)
            .await?
            .unwrap_or_else(|| std::sync::Arc::from(Vec::new())))
    }
}
