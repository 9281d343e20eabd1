-- Which `keep` entries a closing worker left (entrust.lua) are still
-- unread: each is deleted by the worker that read it (or moved on, with a
-- new id, by the cleanup of a worker that died first).
-- Reads only, but for the generation field it makes when missing.
-- KEYS: base, 9 cleanup hash, then one inbox per entry from 10
-- ARGV: base, then per entry, in the order of their inboxes, its id and
--       the receiving worker from 4
-- Returns {identity, then the 1-based position of each entry still there,
-- negative when its worker is not active any more (gone, being cleaned up
-- or closing, drained): nobody may read it}
local left = {(server_run_id() or '') .. ' ' .. data_generation()}
for i = 10, #KEYS do
  local at = i - 9
  local id, worker = ARGV[2 * at + 2], ARGV[2 * at + 3]
  if #redis.call('XRANGE', KEYS[i], id, id) > 0 then
    left[#left + 1] = worker_active(worker, KEYS[9]) and at or -at
  end
end
return left
