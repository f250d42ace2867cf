//! Who leads, the stages of a pass that decide it: a failover of a lost primary, a
//! planned switchover, the leader an engine elects, and what the members' agents say.
//! A change of who leads is a step ([`Lead`]) the pass ends with, carried out first
//! ([`Pass::lead`]); a second primary's fence is planned.

use super::*;
use crate::reconcile;
use crate::reconcile::decide::SwitchoverQuestion;
use crate::reconcile::handover::{self, Handover, Lead, Why};

impl Pass<'_> {
    /// The primary: the one in status, or the member the plugin chooses when it has been
    /// lost for longer than the failover delay; a pass that changes it ends with the
    /// change ([`Pass::lead`]).
    /// What the members' agents said, when asked, is kept with the members.
    pub(super) async fn failover(&mut self, plugin: &Plugin, spec: &EngineSpec, members: &mut Members) -> Flow<Primary> {
        let Leads { primary, after, question } = members.leads.take().expect("the observe stage says who leads");
        let elects = plugin.info().capabilities.elects_leader;
        let chosen = match question {
            FailoverQuestion::Keep => self.switchover(&primary, members, elects),
            FailoverQuestion::Refuse(note) => Ok(Primary { notes: vec![note], ..Primary::keep(&primary) }),
            FailoverQuestion::Ask(candidates) => {
                let said = members.said.clone().unwrap_or_else(|| vec![None; members.observed.len()]);
                match decide::answering_though_down(&members.observed, &primary, &said) {
                    Some(kept) => Ok(kept),
                    None => self.replacement(plugin, spec, members, (&primary, after), candidates, said).await?,
                }
            }
        };
        match chosen {
            Ok(chosen) => {
                self.chosen(&chosen);
                Ok(ControlFlow::Continue(chosen))
            }
            Err(step) => Ok(ControlFlow::Break(self.lead(*step, members).await?)),
        }
    }

    /// Tells the user who leads, as decided: the notes said, a promotion counted.
    pub(super) fn chosen(&mut self, chosen: &Primary) {
        self.say(&chosen.notes);
        for note in &chosen.notes {
            let how = match note.reason {
                Reason::FailoverPromoted => "failover",
                Reason::SwitchoverPromoted => "switchover",
                _ => continue,
            };
            self.ctx.metrics.promoted(self.db, how);
        }
    }

    /// The primary the plugin chooses among `candidates` (with what their agents `said`)
    /// for `primary`, lost for the failover delay `after`: a handover, judged once the old
    /// one's agent answered its fence. Under synchronous replication the plugin is not
    /// asked while the replicas the old primary last had confirm its commits are silent
    /// ([`decide::named_replicas_wait`]).
    async fn replacement(
        &mut self,
        plugin: &Plugin,
        spec: &EngineSpec,
        members: &Members,
        (primary, after): (&str, std::time::Duration),
        candidates: Vec<crate::plugin::Member>,
        said: Vec<Option<crate::agent::Status>>,
    ) -> Result<Result<Primary, Box<Lead>>, Error> {
        let old = members.observed.iter().find(|m| m.name == primary);
        let candidates = members::with_positions(candidates, &members.observed, said);
        let named = old.and_then(|m| m.last_told.as_ref()).map(|(key, _)| key.as_str());
        let answer = match decide::named_replicas_wait(named, spec.synchronous_replicas, &candidates) {
            Some(why) => Ok(crate::plugin::FailoverDecision::NoSafeMember(why)),
            None => match self.ctx.ask::<ChoosePrimary>(plugin, (spec.clone(), candidates)).await {
                Err(Error::Plugin(e)) => Err(e.to_string()),
                asked => Ok(asked?),
            },
        };
        let down = old.and_then(|m| m.down.clone());
        let to = match &answer {
            Ok(crate::plugin::FailoverDecision::Promote { pod, .. }) => pod.clone(),
            // Nothing to fence for: no member is promoted.
            _ => return Ok(Ok(decide::failover(primary, after, down.as_deref(), answer, decide::Fenced::Unknown))),
        };
        let why = Why::Failover { after, down, answer };
        Ok(Err(Box::new(self.handover(primary, to, members, why))))
    }

    /// The lead handed from `primary` to `to`, as a step.
    fn handover(&self, primary: &str, to: String, members: &Members, why: Why) -> Lead {
        let service = Names(&self.name).primary();
        let exists =
            matches!(self.ctx.caches.seen(crate::build::Kind::Service, self.db, &service), super::super::cache::Seen::Present { .. });
        Lead::Handover(Handover {
            from: primary.into(),
            old: members.observed.iter().find(|m| m.name == primary).cloned(),
            to,
            members: members.observed.clone(),
            service: exists.then_some(service),
            why,
        })
    }

    /// A member whose agent says, in this pass, that it takes writes while `primary` leads
    /// is fenced first thing at the end of the pass (an engine that elects its leader has
    /// none such: its members say who leads); says whether one was.
    pub(super) fn hear(&mut self, members: &Members, primary: &str, elects: bool) -> bool {
        let Some(said) = members.said.as_deref().filter(|_| !elects) else { return false };
        let second = decide::second_primaries(&members.observed, primary, said);
        for (member, note) in &second {
            self.plan.fence((*member).clone());
            self.say(std::slice::from_ref(note));
        }
        !second.is_empty()
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

    /// A planned switchover, when the Database's annotation [`crate::names::SWITCHOVER`]
    /// names the member to lead, or, unasked, when the primary's node is cordoned, as a
    /// drain begins (the primary's disruption budget holds its eviction back until another
    /// member leads): the primary is fenced ([`handover::Fence`]); the next passes read the
    /// positions its agent and the member's say, and the member leads once it has reached
    /// the fenced primary's last ([`decide::switchover`]). Done or refused, the request goes.
    fn switchover(&mut self, primary: &str, members: &Members, elects: bool) -> Result<Primary, Box<Lead>> {
        let ctx = self.ctx;
        let asked = self.db.annotations().get(crate::names::SWITCHOVER).cloned();
        // Unasked, a drain of the primary's node moves the primary off it first.
        let drained = match asked {
            None if !elects => decide::drain_target(&members.observed, primary, |node| ctx.caches.cordoned(node)),
            _ => None,
        };
        let target = asked.clone().or_else(|| drained.map(|m| m.name.clone())).unwrap_or_default();
        let old = members.observed.iter().find(|m| m.name == primary);
        let drain = drained.zip(old.and_then(|m| m.node.as_deref())).map(|(to, node)| decide::switching_for_drain(node, primary, &to.name));
        match decide::switchover_question(Some(&target).filter(|t| !t.is_empty()).map(String::as_str), primary, &members.observed, elects) {
            SwitchoverQuestion::None => Ok(Primary::keep(primary)),
            SwitchoverQuestion::Drop(note) => {
                if let Some(target) = &asked {
                    self.plan.drop_request(target.clone());
                }
                Ok(Primary { notes: vec![note], ..Primary::keep(primary) })
            }
            SwitchoverQuestion::Fence => {
                let fenced = ctx.agents.fence_said(self.db, primary).filter(|f| *f == decide::Fenced::Confirmed);
                let Some(fenced) = fenced else {
                    let old = old.cloned();
                    return Err(Box::new(Lead::Fence(handover::Fence {
                        primary: primary.into(),
                        old,
                        target,
                        notes: drain.into_iter().collect(),
                    })));
                };
                // Read by the observe stage, the primary's fence having been answered.
                let of = |pod: &str| members.heard.iter().find(|(m, _)| m == pod).map(|(_, s)| s);
                let (mut chosen, _) =
                    decide::switchover(primary, &target, fenced, old.is_some_and(|m| m.ready), (of(primary), of(&target)));
                if let Some(waits) = &chosen.switching {
                    tracing::info!("{waits}");
                }
                chosen.notes.splice(0..0, drain);
                if !chosen.failed_over {
                    return Ok(chosen);
                }
                Err(Box::new(self.handover(primary, target, members, Why::Switchover(chosen))))
            }
        }
    }

    /// An engine that elects its leader: the observe stage asked every member the
    /// plugin's member query ([`Pass::read_leader`]) and the plugin names the leader from
    /// the answers; the read-write Service follows it. Nobody answering (members
    /// starting, or all down) keeps the last one.
    pub(super) async fn elected(
        &mut self,
        plugin: &Plugin,
        spec: &EngineSpec,
        (members, answered): (&Members, Option<Vec<Option<String>>>),
        primary: Primary,
    ) -> Result<Primary, Error> {
        let ctx = self.ctx;
        let Some(answers) = answered else { return Ok(primary) };
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

    /// What the members of an engine that elects its leader answer to the question the
    /// plugin renders for them (its workload's member query, over TLS trusting the CA of
    /// the Database's certificate when it asks for HTTPS): the observe stage asks, from
    /// the render of the spec as it is, which the render stage's is when no scale or
    /// upgrade is under way (the plugin's answers are remembered). `None`: no question
    /// (none rendered, the render failed, which the render stage says, or HTTPS without
    /// TLS, which host policy refuses).
    pub(super) async fn read_leader(
        &self,
        engine: &Engine,
        observed: &[Observed],
        held: &secrets::Held,
    ) -> Result<Option<Vec<Option<String>>>, Error> {
        let (ctx, db) = (self.ctx, self.db);
        let bootstrap = Names(&self.name).pod(0);
        let mut cluster = build::cluster_context(db, &bootstrap, reconcile::archiver(ctx, db, &engine.plugin).is_some());
        cluster.restoring = self.restore_unfinished();
        let workload = match ctx.ask::<Render>(&engine.plugin, (engine.spec.clone(), cluster)).await {
            Ok(workload) => workload,
            Err(Error::Plugin(_)) => return Ok(None),
            Err(e) => return Err(e),
        };
        let Some(query) = workload.member_query.as_ref() else { return Ok(None) };
        let ca = match (query.https, engine.spec.tls.is_some()) {
            (false, _) => None,
            // The authority's certificate from the TLS Secret (empty until it is there).
            (true, true) => Some(held.tls_ca.clone().unwrap_or_else(|| std::sync::Arc::from(Vec::new()))),
            (true, false) => return Ok(None),
        };
        let domain = format!("{}.{}.svc", Names(&self.name).headless(), self.ns);
        let transport = match &ca {
            Some(ca) => reconcile::ask::Transport::Tls { ca, domain: &domain, identity: None },
            None => reconcile::ask::Transport::Plain(&ctx.members_client),
        };
        Ok(Some(reconcile::ask::answers(transport, query, observed).await))
    }
}
