"""UCI table data modules (Adult, Bank marketing, Diabetes) on small CSV files in the real formats."""

from __future__ import annotations

import zipfile

import numpy as np
import pytest
import torch

from fedlight.datamodules import IID, AdultFederated, BankMarketingFederated, ClassesPerClient, DiabetesFederated
from fedlight.datamodules.support import CorruptFileError

from helpers.data_checks import check_federated, file_url, leftovers
from helpers.data_files import N_ROWS as N, bank_text, write_adult

DIABETES_HEADER = (
    "encounter_id,patient_nbr,race,gender,age,weight,admission_type_id,discharge_disposition_id,admission_source_id,"
    "time_in_hospital,payer_code,medical_specialty,num_lab_procedures,num_procedures,num_medications,"
    "number_outpatient,number_emergency,number_inpatient,diag_1,diag_2,diag_3,number_diagnoses,max_glu_serum,"
    "A1Cresult,metformin,repaglinide,nateglinide,chlorpropamide,glimepiride,acetohexamide,glipizide,glyburide,"
    "tolbutamide,pioglitazone,rosiglitazone,acarbose,miglitol,troglitazone,tolazamide,examide,citoglipton,insulin,"
    "glyburide-metformin,glipizide-metformin,glimepiride-pioglitazone,metformin-rosiglitazone,"
    "metformin-pioglitazone,change,diabetesMed,readmitted"
)


def write_diabetes(root, n: int = N) -> np.ndarray:
    """`diabetic_data.csv`: all 50 columns, '?' for missing values, age as a bracket string."""
    rows, values = [DIABETES_HEADER], []
    for i in range(n):
        age, days = i % 10, 1 + i // 10
        readmitted = ("NO", "<30", ">30")[i % 3]
        drugs = ",".join(["No"] * 23)
        rows.append(
            f"{2278392 + i},{8222157 + i},Caucasian,Female,[{10 * age}-{10 * age + 10}),?,6,25,1,{days},?,"
            f"Pediatrics-Endocrinology,41,0,1,0,0,0,250.83,?,?,1,None,None,{drugs},No,No,{readmitted}"
        )
        values.append([age, days])
    root.mkdir(parents=True, exist_ok=True)
    (root / "diabetic_data.csv").write_text("\n".join(rows) + "\n")
    return np.asarray(values, dtype=np.float64)


def standardized(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(((a - a.mean(0)) / a.std(0)).astype(np.float32))


def test_adult_columns_labels_and_clients(tmp_path) -> None:
    raw = write_adult(tmp_path)
    dm = AdultFederated(
        str(tmp_path), num_clusters=4, num_clients=5, partition=ClassesPerClient(2), val_fraction=0.0, test_fraction=0.0
    )
    data = dm.build()
    check_federated(
        data, num_clients=5, num_classes=4, sample_shape=(5,), dtype=torch.float32, pool_x=standardized(raw)
    )
    assert dm.feature_names == ["age", "fnlwgt", "education-num", "capital-gain", "hours-per-week"]
    assert len(data.val.y) == len(data.test.y) == 0  # p-FClus scores on the data it fits
    again = AdultFederated(
        str(tmp_path), num_clusters=4, num_clients=5, partition=ClassesPerClient(2), val_fraction=0.0, test_fraction=0.0
    ).build()
    assert torch.equal(data.train.y, again.train.y)  # k-means labels are reproducible
    x, y = AdultFederated(str(tmp_path), labels="target").load_pool()
    assert torch.equal(y, torch.tensor([int(i % 3 == 0) for i in range(N)]))  # >50K = 1
    assert torch.allclose(x, standardized(raw), atol=1e-5)
    unscaled, _ = AdultFederated(str(tmp_path), standardize=False).load_pool()
    assert torch.equal(unscaled, torch.from_numpy(raw.astype(np.float32)))


def test_bank_marketing(tmp_path) -> None:
    (tmp_path / "bank-additional-full.csv").write_text(bank_text())
    dm = BankMarketingFederated(str(tmp_path), num_clusters=3, num_clients=4, public_size=6)
    data = dm.build()
    check_federated(data, num_clients=4, num_classes=3, sample_shape=(6,), dtype=torch.float32, total=N)
    assert data.public_x.shape == (6, 6)
    x, y = BankMarketingFederated(str(tmp_path), labels="target").load_pool()
    assert x.shape == (N, 6) and torch.equal(y, torch.tensor([int(i % 4 == 0) for i in range(N)]))
    assert torch.allclose(x.mean(0), torch.zeros(6), atol=1e-5) and torch.allclose(
        x.std(0, unbiased=False), torch.ones(6), atol=1e-4
    )


def test_diabetes_age_brackets(tmp_path) -> None:
    raw = write_diabetes(tmp_path)
    dm = DiabetesFederated(str(tmp_path), num_clients=3, partition=IID(), test_fraction=0.2)
    data = dm.build()
    check_federated(
        data, num_clients=3, num_classes=10, sample_shape=(2,), dtype=torch.float32, pool_x=standardized(raw)
    )
    unscaled, y = DiabetesFederated(str(tmp_path), standardize=False, labels="target").load_pool()
    assert torch.equal(unscaled, torch.from_numpy(raw.astype(np.float32)))  # "[30-40)" -> 3
    assert torch.equal(y, torch.arange(N) % 3) and dm.num_classes == 10


@pytest.mark.parametrize(
    "cls, name",
    [
        (AdultFederated, "adult.data"),
        (BankMarketingFederated, "bank-additional-full.csv"),
        (DiabetesFederated, "diabetic_data.csv"),
    ],
)
def test_missing_file_names_path_and_source(tmp_path, cls, name) -> None:
    with pytest.raises(FileNotFoundError) as err:
        cls(str(tmp_path / "uci")).build()
    assert str(tmp_path / "uci" / name) in str(err.value) and "archive.ics.uci.edu" in str(err.value)
    assert not (tmp_path / "uci").exists()


def test_corrupt_files_name_path_and_line(tmp_path) -> None:
    write_adult(tmp_path)
    path = tmp_path / "adult.data"
    path.write_text(path.read_text().replace(", 13, Never", ", thirteen, Never", 1))
    with pytest.raises(CorruptFileError, match="line [0-9]+: column 'education-num' is 'thirteen'"):
        AdultFederated(str(tmp_path)).build()
    (tmp_path / "bank-additional-full.csv").write_text(bank_text().replace('"euribor3m"', '"euribor"'))
    with pytest.raises(CorruptFileError, match="lacks the columns"):
        BankMarketingFederated(str(tmp_path)).build()
    write_diabetes(tmp_path)
    path = tmp_path / "diabetic_data.csv"
    path.write_text(path.read_text() + "1,2,3\n")
    with pytest.raises(CorruptFileError, match=f"{path}.*\n.*line {N + 2} has 3 fields"):
        DiabetesFederated(str(tmp_path)).build()


def test_download_from_archive_and_plain_file(tmp_path, monkeypatch) -> None:
    archive = tmp_path / "bank-additional.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("__MACOSX/bank-additional/._bank-additional-full.csv", b"\x00\x05junk")
        z.writestr("bank-additional/bank-additional-full.csv", bank_text())
    monkeypatch.setattr(BankMarketingFederated, "URL", file_url(archive))
    root = tmp_path / "data"
    assert BankMarketingFederated(str(root), download=True, num_clients=2).build().num_clients == 2
    assert (root / "bank-additional-full.csv").read_text() == bank_text() and leftovers(root) == []
    write_adult(tmp_path / "src")
    monkeypatch.setattr(AdultFederated, "URL", file_url(tmp_path / "src" / "adult.data"))
    assert AdultFederated(str(root), download=True, num_clusters=2).load_pool()[0].shape == (N, 5)
    monkeypatch.setattr(DiabetesFederated, "URL", file_url(tmp_path / "nowhere.zip"))
    with pytest.raises(OSError):
        DiabetesFederated(str(root), download=True).build()
    assert sorted(p.name for p in root.iterdir()) == ["adult.data", "bank-additional-full.csv"]


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="labels"):
        AdultFederated("x", labels="income")
    with pytest.raises(ValueError, match="num_clusters"):
        AdultFederated("x", num_clusters=0)


def test_listed() -> None:
    from fedlight.run.catalog import components

    listed = components()["data modules"]
    for name in ("AdultFederated", "BankMarketingFederated", "DiabetesFederated"):
        assert listed[name] == f"fedlight.datamodules.uci.{name}"
    assert "UCITableFederated" not in listed  # the abstract base
