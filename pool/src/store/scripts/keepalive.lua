-- Renews the keep-alive of a node and its workers on server time.
-- KEYS: base, 9 keepalive hash, 10 keepalive revision, 11 nodes hash,
--       12 nodes revision, 13 cleanup hash, 14 cleanup revision
-- ARGV: base, 4 keepalive channel, 5 nodes channel, 6 node id,
--       7 worker ttl ms, 8 cleanup channel, 9 server time (ms) of the last
--       renewal whose reply the node heard ('0': none yet), 10.. worker ids
--       (bounded by the node's worker count)
-- Returns {now_ms, {unknown worker ids...}, {claimed worker ids...}}:
-- workers no longer registered (cleaned up, or Redis lost its data) are not
-- renewed; workers renewed under another node's cleanup claim are named,
-- for their cleaner may be moving their inbox entries, so they start
-- nothing until a renewal finds the claim gone (chaos soak seed 1598: a
-- worker whose lease came back after Redis refused writes started a fresh
-- entry its cleaner moved on, and both ran it). Finding the pool's epoch
-- gone (data loss) opens the recovery window. Every call notes Redis's
-- pulse (`note_pulse`): a worker's silence counts only while Redis served.
-- Returns {now_ms, 0} and renews nothing when the node has heard no reply
-- for more than a TTL: its link fails one way (commands arrive, replies do
-- not), so it has stopped its jobs for want of a renewal it heard, and
-- counting its renewals would keep those jobs on it, stopped, for as long
-- as the failure lasts. A node whose lease holds has heard a renewal less
-- than its lease stop ago (less than a TTL), so it is never refused.
-- One change message per map whatever the worker count: the workers'
-- renewals go out as one batch on the keepalive map, the node's on the
-- nodes map.
-- A cleanup claim on a worker that renews, older than a TTL, goes (but
-- for the renewing node's own claim of a close in progress): its
-- cleaner is gone or stalled (a cleaner checks its claim at every step and
-- stops once it is not its own), or Redis went back to a moment within a
-- cleanup that has finished since. Left, it would keep the live worker
-- from resuming its jobs and out of the ring for good.
local now_n = now_ms()
local now = string.format('%d', now_n)
local ttl = tonumber(ARGV[7])
local heard = tonumber(ARGV[9]) or 0
-- Served, whether or not renewed below: the pulse that tells a worker's
-- silence from Redis's own (`note_pulse` in base.lua).
note_pulse(ttl)
if heard > 0 and now_n - heard > ttl then
  return {now, 0}
end
local unknown, claimed = {}, {}
-- This node's own claim on a worker it is closing (`retire_worker`): the
-- close takes the worker out of the ring and removes it when done, and a
-- close may take longer than a TTL (slow stops, a recovery). Cleared
-- here, it would put the leaving worker back in every ring, to be handed
-- jobs it never reads.
local closing = ARGV[6] .. ' closing'
recovering(ttl)
local renewed = rmap_batch(KEYS[9], KEYS[10], ARGV[4])
local unclaimed = rmap_batch(KEYS[13], KEYS[14], ARGV[8])
for i = 10, #ARGV do
  local w = ARGV[i]
  if redis.call('HEXISTS', WORKERS[1], w) == 1 then
    rmap_batch_set(renewed, w, now)
    local claim = redis.call('HGET', KEYS[13], w)
    if claim and claim ~= closing and now_n - claim_since(claim) > ttl then
      rmap_batch_del(unclaimed, w)
    elseif claim and claim ~= closing then
      claimed[#claimed + 1] = w
    end
  else
    unknown[#unknown + 1] = w
  end
end
rmap_batch_flush(renewed)
rmap_batch_flush(unclaimed)
rmap_set(KEYS[11], KEYS[12], ARGV[5], ARGV[6], now)
return {now, unknown, claimed}
