-- Which of the jobs a worker remembers passing on (hand-offs, orphans it
-- left or gave back; see handoffs.rs) have ended since, while Redis still
-- knows: the key's fencing counter is at or above the remembered token (the
-- hand-off, or something newer, happened here) and Redis holds no record,
-- pending guard or payload of the key. Only the end of a run takes a
-- payload away (a stop, the handler's own end, a failed start), so the run
-- the hand-off led to, or a newer one, ended. Such a job must not be given
-- back after a later loss: whoever remembers its stop may be gone by then.
-- Every run of the key up to the counter is over (a copy of one is refused
-- over that counter, as over a stop's tombstone), so the worker makes that
-- stand after a loss as it does its own stops (`stop_stands.lua` with the
-- counter): Redis may go back to a state that shows such a run going on
-- under a worker that left since.
-- It also names the jobs still waiting to start: a payload and no record
-- (an orphan, or a start entry not claimed yet), with the payload's
-- creation time. Redis alone holds those, however long the start takes (a
-- slow or overloaded new owner, a start refused and requeued again), so
-- the worker keeps remembering one whose payload is of the admission it
-- remembers, not only for the fixed time a start usually takes. (A newer
-- admission's payload means the remembered run ended: not kept for it.)
-- Unless every end Redis knows of the key was of a dispatch older than
-- the remembered one (`note_dispatch_end`): after a rollback a run of an
-- older dispatch, moved and ended, takes tokens from the clock above the
-- one remembered. That job is named a third way: the worker gives its payload
-- back (`handoff_stands.lua`), as Redis holds nothing of it.
-- Reads only.
-- KEYS: base
-- ARGV: base, then (job key, token, admission stamp in µs) triples from 4
-- Returns {{triple number (1-based), counter} for each ended job, flattened;
--          {triple number, payload's admission stamp in µs} for each job waiting to start,
--          flattened;
--          {triple number} for each job only older dispatches' ends passed}
local ended, waiting, passed = {}, {}, {}
local pair = 0
for i = 4, #ARGV - 2, 3 do
  pair = pair + 1
  local key = ARGV[i]
  -- A job someone runs is neither: its payload is not read (it may be
  -- large, and most remembered jobs run).
  if not mget(JOBS, key) then
    local stored = redis.call('HGET', PAYLOADS, key)
    if stored then
      waiting[#waiting + 1] = pair
      waiting[#waiting + 1] = string.format('%d', payload_admitted(stored))
    else
      local current = tonumber(redis.call('HGET', FENCING, key) or '')
      if current and current >= tonumber(ARGV[i + 1]) and not mget(PENDING, key) then
        if only_older_ended(key, tonumber(ARGV[i + 2]) or 0) then
          passed[#passed + 1] = pair
        else
          ended[#ended + 1] = pair
          ended[#ended + 1] = string.format('%d', current)
        end
      end
    end
  end
end
return {ended, waiting, passed}
