-- Which `keep` entries a closing worker left (entrust.lua) are still
-- unread: each is deleted by the worker that read it (or moved on, with a
-- new id, by the cleanup of a worker that died first).
-- Reads only, but for the generation field it makes when missing.
-- KEYS: base, 9 cleanup hash, 10 keep-alive hash, then one inbox per
--       entry from 11
-- ARGV: base, 4 ttl ms, then per entry, in the order of their inboxes,
--       its id and the receiving worker from 5
-- Returns {identity, then the 1-based position of each entry still there,
-- negative when its worker will not read it (gone, being cleaned up or
-- closing, drained, silent for over a TTL)}
local left = {(server_run_id() or '') .. ' ' .. data_generation()}
local ttl = tonumber(ARGV[4])
for i = 11, #KEYS do
  local at = i - 10
  local id, worker = ARGV[2 * at + 3], ARGV[2 * at + 4]
  if #redis.call('XRANGE', KEYS[i], id, id) > 0 then
    left[#left + 1] = worker_reading(worker, KEYS[9], KEYS[10], ttl) and at or -at
  end
end
return left
