-- Removes a worker once it owns nothing and its inbox is empty.
-- KEYS: base, 9 keepalive hash, 10 keepalive revision, 11 cleanup hash,
--       12 cleanup revision, 13 inbox
-- ARGV: base, 4 keepalive channel, 5 cleanup channel, 6 worker id
-- Returns 'ok' | 'inbox_not_empty'
local w = ARGV[6]
if redis.call('EXISTS', KEYS[13]) == 1 and redis.call('XLEN', KEYS[13]) > 0 then
  return 'inbox_not_empty'
end
mdel(WORKERS, w)
rmap_del(KEYS[9], KEYS[10], ARGV[4], w)
rmap_del(KEYS[11], KEYS[12], ARGV[5], w)
redis.call('DEL', KEYS[13])
return 'ok'
