-- Removes a worker once it owns nothing and its inbox is empty.
-- KEYS: base, 9 keepalive hash, 10 keepalive revision, 11 cleanup hash,
--       12 cleanup revision, 13 inbox
-- ARGV: base, 4 keepalive channel, 5 cleanup channel, 6 worker id,
--       7 the cleaner's node id when a cleanup removes a dead worker ('' when
--       a worker leaves): its claim on the worker must still be its own
-- Returns 'ok' | 'inbox_not_empty' | 'not_claimed' (the worker came back
-- and cleared a stale claim, or another cleaner took it over: nothing done)
local w = ARGV[6]
if not claim_held(KEYS[11], w, ARGV[7]) then
  return 'not_claimed'
end
if redis.call('EXISTS', KEYS[13]) == 1 and redis.call('XLEN', KEYS[13]) > 0 then
  return 'inbox_not_empty'
end
mdel(WORKERS, w)
rmap_del(KEYS[9], KEYS[10], ARGV[4], w)
rmap_del(KEYS[11], KEYS[12], ARGV[5], w)
redis.call('DEL', KEYS[13])
return 'ok'
