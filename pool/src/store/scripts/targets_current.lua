-- Which of some workers a job may be moved to now (`worker_current` in
-- base.lua), and how many entries each has queued. A rebalance asks before
-- it stops the jobs it would hand on: a job whose new owner does not read
-- its inbox (a registration a rollback brought back, a worker dead and not
-- cleaned up yet) keeps running where it is, rather than be stopped,
-- refused and started again; and a job is stopped for an owner only while
-- few entries wait in its inbox (see `rebalance.rs`), so that a job is not
-- stopped long before its new owner can start it.
-- Reads only.
-- KEYS: base, 9 cleanup hash, 10 keep-alive hash, 11.. the workers' inboxes
-- ARGV: base, 4 worker ttl ms, 5.. worker ids (in the order of their inboxes)
-- Returns per worker, in order: -1 (not a target now) or the length of its
-- inbox (entries not handled yet, or handled and not removed yet).
local ttl = tonumber(ARGV[4])
local current = {}
for i = 5, #ARGV do
  if worker_current(ARGV[i], KEYS[9], KEYS[10], ttl) then
    current[#current + 1] = redis.call('XLEN', KEYS[i + 6])
  else
    current[#current + 1] = -1
  end
end
return current
