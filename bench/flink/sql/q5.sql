SET 'pipeline.name' = 'nexmark-q5';
SET 'execution.runtime-mode' = 'streaming';
SET 'parallelism.default' = '@PARALLELISM@';
SET 'table.dml-sync' = 'false';

CREATE TABLE bid (
  auction BIGINT,
  bidder BIGINT,
  price BIGINT,
  channel STRING,
  url STRING,
  extra STRING,
  date_time AS CAST(CURRENT_TIMESTAMP AS TIMESTAMP(3)),
  WATERMARK FOR date_time AS date_time - INTERVAL '1' SECOND
) WITH (
  'connector' = 'datagen',
  'number-of-rows' = '@ROWS@',
  'rows-per-second' = '1000000000',
  'fields.auction.min' = '1000',
  'fields.auction.max' = '10999',
  'fields.bidder.min' = '1000',
  'fields.bidder.max' = '1999',
  'fields.price.min' = '100',
  'fields.price.max' = '10000000',
  'fields.channel.length' = '8',
  'fields.url.length' = '60',
  'fields.extra.length' = '100'
);

CREATE TABLE sink (auction BIGINT, num BIGINT) WITH ('connector' = 'blackhole');

INSERT INTO sink
SELECT AuctionBids.auction, AuctionBids.num
FROM (
  SELECT auction, count(*) AS num, window_start AS starttime, window_end AS endtime
  FROM TABLE(HOP(TABLE bid, DESCRIPTOR(date_time), INTERVAL '2' SECOND, INTERVAL '10' SECOND))
  GROUP BY auction, window_start, window_end
) AS AuctionBids
JOIN (
  SELECT max(CountBids.num) AS maxn, CountBids.starttime, CountBids.endtime
  FROM (
    SELECT count(*) AS num, window_start AS starttime, window_end AS endtime
    FROM TABLE(HOP(TABLE bid, DESCRIPTOR(date_time), INTERVAL '2' SECOND, INTERVAL '10' SECOND))
    GROUP BY auction, window_start, window_end
  ) AS CountBids
  GROUP BY CountBids.starttime, CountBids.endtime
) AS MaxBids
ON AuctionBids.starttime = MaxBids.starttime
  AND AuctionBids.endtime = MaxBids.endtime
  AND AuctionBids.num >= MaxBids.maxn;
