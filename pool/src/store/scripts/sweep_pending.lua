-- One step of the stale-pending sweep (run by the pool's elected
-- sweeper): a page of the pending hash (HSCAN cursor); every guard whose
-- deadline (server time) has passed is removed, in one replicated batch.
-- The job then shows up as an orphan and is requeued after the grace.
-- KEYS: base
-- ARGV: base, 4 cursor, 5 page size (HSCAN COUNT), 6 the least server time
--       (ms) it can be now by the caller's own clock: deadlines are judged
--       by the smaller of that and `TIME`, so a step of the server's clock
--       does not end a dispatch's guard early (`server_clock.rs`)
-- Returns {cursor, removed keys...}
local now = math.min(now_ms(), tonumber(ARGV[6]) or now_ms())
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
