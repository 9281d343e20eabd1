-- Which of some workers a job may be moved to now (`worker_current` in
-- base.lua). A rebalance asks before it stops the jobs it would hand on:
-- a job whose new owner does not read its inbox (a registration a
-- rollback brought back, a worker dead and not cleaned up yet) keeps
-- running where it is, rather than be stopped, refused and started again.
-- Reads only.
-- KEYS: base, 9 cleanup hash, 10 keep-alive hash
-- ARGV: base, 4 worker ttl ms, 5.. worker ids
-- Returns one 1 (a target) or 0 (not one now) per worker, in order.
local ttl = tonumber(ARGV[4])
local current = {}
for i = 5, #ARGV do
  current[#current + 1] = worker_current(ARGV[i], KEYS[9], KEYS[10], ttl) and 1 or 0
end
return current
