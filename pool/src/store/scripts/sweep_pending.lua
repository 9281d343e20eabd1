-- One step of the stale-pending sweep (run by the pool's elected
-- sweeper): a page of the pending hash (HSCAN cursor); every guard whose
-- deadline (server time) has passed is removed, in one replicated batch.
-- The job then shows up as an orphan and is requeued after the grace.
-- KEYS: base
-- ARGV: base, 4 cursor, 5 page size (HSCAN COUNT)
-- Returns {cursor, removed keys...}
local now = now_ms()
local page = redis.call('HSCAN', PENDING[1], ARGV[4], 'COUNT', tonumber(ARGV[5]))
local batch = rmap_batch(PENDING[1], PENDING[2], PENDING[3])
local reply = {page[1]}
local fields = page[2]
for i = 1, #fields, 2 do
  local deadline = tonumber(string.match(fields[i + 1], '^%d+ (%d+)') or '')
  if deadline and deadline < now then
    rmap_batch_del(batch, fields[i])
    reply[#reply + 1] = fields[i]
  end
end
rmap_batch_flush(batch)
return reply
