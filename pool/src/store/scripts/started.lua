-- Finishes a start entry: removes it from the worker's inbox and answers
-- the dispatcher. After a handler started a claimed job (status 'ok'), or
-- when a worker drops an entry whose key already runs (status 'ok' for its
-- own run, 'superseded' for a newer one elsewhere).
-- KEYS: base, 9 worker inbox, 10 reply stream (any pool key when no reply),
--       11 keep-alive revision (`went_back`)
-- ARGV: base, 4 job key, 5 token, 6 worker id, 7 inbox entry id,
--       8 reply request id (0: none), 9 status to answer,
--       10 worker ttl ms (the recovery window after a data loss),
--       11 the revisions the node has seen (`went_back`)
-- Returns 'ok' when the key is owned by this worker with this token;
-- 'recovering' when the claim vanished with the rest of Redis's data (the
-- worker keeps the run and re-asserts it once registered again); else
-- 'lost' (the claim was taken: the caller stops its run, and the
-- dispatcher is told 'superseded'). The entry is removed either way. The
-- dispatcher of a 'recovering' start is told 'recovering'.
local status = 'ok'
if mget(JOBS, ARGV[4]) ~= ARGV[6] .. ' ' .. ARGV[5] then
  if went_back(ARGV[11], tonumber(ARGV[10]), KEYS[11]) or recovering(tonumber(ARGV[10])) then
    status = 'recovering'
  else
    status = 'lost'
  end
end
stream_remove(KEYS[9], ARGV[7])
if ARGV[8] ~= '0' then
  local answer = ARGV[9]
  if status == 'lost' then
    answer = 'superseded'
  elseif status == 'recovering' then
    -- The claim went with Redis's data, and the payload may have: the
    -- dispatcher admits again once the pool has recovered (and finds this
    -- run re-asserted), rather than be promised a job only this worker
    -- holds.
    answer = 'recovering'
  end
  stream_add(KEYS[10], 'reply', ARGV[8] .. ' ' .. answer, 1000)
end
return status
