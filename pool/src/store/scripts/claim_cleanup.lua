-- Claims the cleanup of a worker that Redis says is dead: its keep-alive
-- (or, if never renewed, its registration time) is older than the TTL on
-- server time. A claim older than a TTL (its cleaner died) is taken over.
-- Deciding here rather than from a node's replica means that a node with a
-- stale replica (a paused process, pub/sub lagging after a reconnect)
-- never judges a live worker dead.
-- KEYS: base, 9 keepalive hash, 10 cleanup hash, 11 cleanup revision,
--       12 keep-alive revision (`went_back`)
-- ARGV: base, 4 cleanup channel, 5 worker id, 6 node id, 7 ttl ms,
--       8 the revisions the caller has seen (`went_back`), 9 the least
--       server time (ms) it can be now by the caller's own clock
-- Silence is judged by the smaller of `TIME` and that floor: a step of
-- the server's wall clock makes every keep-alive look a step old at once,
-- but not on the caller's monotonic clock (`server_clock.rs`).
-- No claim while the pool recovers from a data loss or a rollback: the
-- older state may show the worker owning a run stopped since, whose stop
-- the node that asked for it or carried it out makes stand again during
-- its recovery (`stop_stands.lua`); a requeue before that would start the
-- stopped run again with a newer token, over which the stop cannot stand.
-- Nor on a state older than the caller has seen, before any node marked a
-- recovery: it may show the worker owning jobs a cleanup lost to the
-- rollback had moved, which run where they went (`went_back` opens the
-- window for every later claim).
-- Returns {status, silent_ms}; status is 'claimed' | 'taken_over' |
-- 'alive' | 'claimed_by_other' | 'gone' | 'recovering'.
local worker, node, ttl = ARGV[5], ARGV[6], tonumber(ARGV[7])
local registration = mget(WORKERS, worker)
if not registration then return {'gone', 0} end
local now = now_ms()
local judged = math.min(now, tonumber(ARGV[9]) or now)
local silent = judged - silent_since(worker, registration, KEYS[9], ttl)
if silent <= ttl then return {'alive', silent} end
if went_back(ARGV[8], ttl, KEYS[12]) or recovering(ttl) then
  return {'recovering', silent}
end
local claim = string.format('%s %d', node, now)
local current = redis.call('HGET', KEYS[10], worker)
if not current then
  rmap_set(KEYS[10], KEYS[11], ARGV[4], worker, claim)
  return {'claimed', silent}
end
local since = claim_since(current)
if judged - since > ttl then
  rmap_set(KEYS[10], KEYS[11], ARGV[4], worker, claim)
  return {'taken_over', silent}
end
return {'claimed_by_other', silent}
