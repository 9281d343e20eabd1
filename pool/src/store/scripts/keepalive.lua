-- Renews the keep-alive of a node and its workers on server time.
-- KEYS: base, 9 keepalive hash, 10 keepalive revision, 11 nodes hash,
--       12 nodes revision
-- ARGV: base, 4 keepalive channel, 5 nodes channel, 6 node id,
--       7 worker ttl ms, 8.. worker ids (bounded by the node's worker count)
-- Returns {now_ms, unknown worker ids...}: workers no longer registered
-- (cleaned up, or Redis lost its data) are not renewed. Finding the pool's
-- epoch gone (data loss) opens the recovery window.
-- One change message per map whatever the worker count: the workers'
-- renewals go out as one batch on the keepalive map, the node's on the
-- nodes map.
local now = string.format('%d', now_ms())
local unknown = {now}
recovering(tonumber(ARGV[7]))
local renewed = rmap_batch(KEYS[9], KEYS[10], ARGV[4])
for i = 8, #ARGV do
  local w = ARGV[i]
  if redis.call('HEXISTS', WORKERS[1], w) == 1 then
    rmap_batch_set(renewed, w, now)
  else
    unknown[#unknown + 1] = w
  end
end
rmap_batch_flush(renewed)
rmap_set(KEYS[11], KEYS[12], ARGV[5], ARGV[6], now)
return unknown
